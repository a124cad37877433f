! ONNX models from Fortran (issue 23): a U-Net graph trained through the array lists
! (mpigrad_train_step_multi) exactly as through the one-array call, token ids as integer(8)
! arrays with dense labels, and the list's errors. One process, no MPI.
!   mpigrad-test-fortran-onnx DATA_DIR
program test_fortran_onnx
  use, intrinsic :: iso_c_binding
  use mpigrad
  implicit none

  integer, parameter :: b = 8, t = 6, v = 11
  integer :: failures = 0, checks = 0, i, j, step
  character(len=1024) :: data
  type(mpigrad_model) :: single, multi, tokens_model
  type(mpigrad_array_list) :: inputs, labels, outputs
  real(c_float) :: u(8, 8, 1, b), du(8, 8, 1, b), p1(8, 8, 1, b), p2(8, 8, 1, b)
  real(c_float) :: logits(t, v, b)
  integer(c_int64_t) :: ids(t, b), next_ids(t, b)
  real(c_double) :: loss1, loss2, first, last
  character(len=:), allocatable :: unet, transformer

  call get_command_argument(1, data)
  unet = "[model]" // new_line('a') // "name = onnx" // new_line('a') // "file = " // &
      trim(data) // "/unet.legacy.onnx" // new_line('a') // "[loss]" // new_line('a') // &
      "name = mse" // new_line('a')
  transformer = "[model]" // new_line('a') // "name = onnx" // new_line('a') // "file = " // &
      trim(data) // "/transformer.legacy.onnx" // new_line('a') // "[loss]" // new_line('a') // &
      "name = cross_entropy" // new_line('a') // "[optim]" // new_line('a') // "lr = 0.03" // &
      new_line('a')

  ! u(x, y, channel, sample): 8 samples of shape [1, 8, 8].
  do j = 1, b
    do step = 1, 8
      do i = 1, 8
        u(i, step, 1, j) = real(sin(0.1d0 * (i + 8 * step + 64 * j)), c_float)
      end do
    end do
  end do
  du = 0.5 * u
  call expect(mpigrad_model_create(single, unet), MPIGRAD_SUCCESS, 'create the U-Net')
  call expect(mpigrad_model_create(multi, unet), MPIGRAD_SUCCESS, 'create it again')
  call expect(mpigrad_array_list_create(inputs), MPIGRAD_SUCCESS, 'list create')
  call expect(mpigrad_array_list_create(labels), MPIGRAD_SUCCESS, 'list create')
  call expect(mpigrad_array_list_create(outputs), MPIGRAD_SUCCESS, 'list create')
  call expect(mpigrad_array_list_add(inputs, u), MPIGRAD_SUCCESS, 'list add input')
  call expect(mpigrad_array_list_add(labels, du), MPIGRAD_SUCCESS, 'list add label')
  call expect(mpigrad_array_list_add(outputs, p2), MPIGRAD_SUCCESS, 'list add output')
  do step = 1, 5
    call expect(mpigrad_train_step(single, u, du, loss1), MPIGRAD_SUCCESS, 'train_step')
    call expect(mpigrad_train_step_multi(multi, inputs, labels, loss2), MPIGRAD_SUCCESS, &
                'train_step_multi')
    call check(loss1 == loss2, 'the list call trains as the one-array call')
  end do
  call expect(mpigrad_predict(single, u, p1), MPIGRAD_SUCCESS, 'predict')
  call expect(mpigrad_predict_multi(multi, inputs, outputs), MPIGRAD_SUCCESS, 'predict_multi')
  call check(all(p1 == p2), 'the list prediction is the one-array prediction')
  ! Two inputs for a graph of one: named, in the list's terms.
  call expect(mpigrad_array_list_add(inputs, u), MPIGRAD_SUCCESS, 'list add a second input')
  call expect(mpigrad_train_step_multi(multi, inputs, labels), MPIGRAD_ERROR_SHAPE, &
              'two inputs for one')
  call check(index(mpigrad_last_error(), 'n_inputs is 2') > 0, 'the count is named')
  call expect(mpigrad_array_list_destroy(inputs), MPIGRAD_SUCCESS, 'list destroy')
  call expect(mpigrad_array_list_destroy(inputs), MPIGRAD_SUCCESS, 'list destroy twice')
  call expect(mpigrad_array_list_destroy(labels), MPIGRAD_SUCCESS, 'list destroy')
  call expect(mpigrad_array_list_destroy(outputs), MPIGRAD_SUCCESS, 'list destroy')

  ! Token ids as integer(8), ids(position, sample); labels the next token at each position.
  do j = 1, b
    do i = 1, t
      ids(i, j) = mod(7 * i + 3 * j, v)
    end do
  end do
  next_ids = mod(ids * 3 + 1, v)
  call expect(mpigrad_model_create(tokens_model, transformer), MPIGRAD_SUCCESS, 'transformer')
  do step = 1, 30
    call expect(mpigrad_train_step(tokens_model, ids, next_ids, loss1), MPIGRAD_SUCCESS, &
                'token step')
    if (step == 1) first = loss1
    last = loss1
  end do
  print '(a, f8.4, a, f8.4)', 'transformer from Fortran: loss ', first, ' -> ', last
  call check(last < 0.5 * first, 'the token model learns')
  ! logits(position, class, sample): the graph's [batch, 11, 6] in Fortran order.
  call expect(mpigrad_predict(tokens_model, ids, logits), MPIGRAD_SUCCESS, 'token predict')
  call expect(mpigrad_train_step(tokens_model, ids, next_ids(1:1, :)), MPIGRAD_ERROR_SHAPE, &
              'labels of one position')
  call check(index(mpigrad_last_error(), 'in Fortran order') > 0, 'the shape is in Fortran order')

  call expect(mpigrad_model_destroy(single), MPIGRAD_SUCCESS, 'destroy')
  call expect(mpigrad_model_destroy(multi), MPIGRAD_SUCCESS, 'destroy')
  call expect(mpigrad_model_destroy(tokens_model), MPIGRAD_SUCCESS, 'destroy')
  print '(a, i0, a, i0, a)', 'fortran_onnx: ', checks, ' checks, ', failures, ' failed'
  if (failures > 0) error stop 1

contains

  subroutine check(condition, what)
    logical, intent(in) :: condition
    character(len=*), intent(in) :: what
    checks = checks + 1
    if (.not. condition) then
      failures = failures + 1
      print *, 'FAILED: ', what
    end if
  end subroutine check

  subroutine expect(status, wanted, what)
    integer(c_int), intent(in) :: status, wanted
    character(len=*), intent(in) :: what
    checks = checks + 1
    if (status /= wanted) then
      failures = failures + 1
      print *, 'FAILED: ', what, ': status ', mpigrad_status_name(status), ': ', &
          mpigrad_last_error()
    end if
  end subroutine expect

end program test_fortran_onnx
