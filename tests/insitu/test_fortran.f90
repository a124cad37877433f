! The Fortran module under mpirun, with `use mpi` (integer communicators): column-major arrays
! map to [batch, sample...] with the batch last; arrays of any rank that hold the same samples
! train and predict alike; non-contiguous sections and real(8) arrays are accepted; wrong
! kinds, shapes and handles give their codes and messages. The host owns MPI throughout. Also:
! every C entry point through the module (copied_bytes, status_name, mean_loss, the step
! callback), default-kind integer arguments, and shapes checked rank and extent, in Fortran order.
module test_fortran_callback
  use, intrinsic :: iso_c_binding
  use mpigrad, only: mpigrad_model
  implicit none
  integer :: calls = 0
  integer(c_int64_t) :: last_step = 0
contains
  subroutine on_step(model, step, lr, user_data) bind(c)
    type(mpigrad_model), value :: model
    integer(c_int64_t), value :: step
    real(c_double), value :: lr
    type(c_ptr), value :: user_data
    if (model%id > 0 .and. lr > 0 .and. .not. c_associated(user_data)) calls = calls + 1
    last_step = step
  end subroutine on_step
end module test_fortran_callback

program test_fortran
  use, intrinsic :: iso_c_binding
  use mpi
  use mpigrad
  use test_fortran_callback
  implicit none

  integer :: failures = 0, checks = 0, ierr, rank, total
  type(mpigrad_model) :: model, other, none
  real(c_float) :: x(4, 6), x3(2, 2, 6), wide(8, 6), y(3, 6), p1(3, 6), p2(3, 6), p3(3, 6)
  real(c_double) :: x8(4, 6), loss
  integer(c_int32_t) :: labels(6)
  integer :: i, j, steps, bytes
  integer(c_int64_t) :: steps8, bytes8
  real(c_double), target :: mean
  type(mpigrad_model) :: image
  real(c_float) :: x4(2, 2, 1, 6)
  character(len=*), parameter :: config = "[model]" // new_line('a') // "name = mlp" // &
      new_line('a') // "hidden = 8" // new_line('a') // "input_shape = 4" // new_line('a') // &
      "outputs = 3" // new_line('a') // "[loss]" // new_line('a') // "name = mse" // new_line('a')

  call MPI_Init(ierr)
  call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
  call expect(mpigrad_model_create_distributed(model, config, MPI_COMM_WORLD, "cpu"), &
              MPIGRAD_SUCCESS, 'create_distributed with an integer communicator')
  call expect(mpigrad_model_create(other, config), MPIGRAD_SUCCESS, 'create')

  ! Six samples of 4 values: x(:, k) is sample k (column-major: the batch is the last dim).
  do j = 1, 6
    do i = 1, 4
      x(i, j) = real(sin(0.3d0 * (i + 4 * j)), c_float)
    end do
    y(:, j) = [x(1, j) - x(2, j), 0.5 * x(3, j), x(4, j) * 2]
  end do
  call expect(mpigrad_train_step(model, x, y, loss), MPIGRAD_SUCCESS, 'train_step rank 2')
  call check(loss > 0, 'the loss is positive')
  call expect(mpigrad_train_step(model, x, y), MPIGRAD_SUCCESS, 'train_step without the loss')
  call expect(mpigrad_last_loss(model, loss), MPIGRAD_SUCCESS, 'last_loss')

  ! The same samples as a rank-3 array (2, 2, 6), as real(8), and as a strided section.
  x3 = reshape(x, [2, 2, 6])
  x8 = x
  wide = -1e9
  wide(1:8:2, :) = x
  call expect(mpigrad_predict(model, x, p1), MPIGRAD_SUCCESS, 'predict rank 2')
  call expect(mpigrad_predict(model, x3, p2), MPIGRAD_SUCCESS, 'predict rank 3')
  call check(all(p1 == p2), 'rank-2 and rank-3 arrays of the same samples predict the same')
  call expect(mpigrad_predict(model, x8, p2), MPIGRAD_SUCCESS, 'predict real(8)')
  call check(maxval(abs(p1 - p2)) < 1e-6, 'real(8) input predicts what real(4) does')
  call expect(mpigrad_predict(model, wide(1:8:2, :), p3), MPIGRAD_SUCCESS, 'predict a section')
  call check(all(p1 == p3), 'a non-contiguous section predicts what the dense array does')

  ! Errors, from Fortran.
  call expect(mpigrad_train_step(model, x(1:3, :), y, loss), MPIGRAD_ERROR_SHAPE, 'wrong shape')
  call mentions('holds 3 values per sample')
  call expect(mpigrad_train_step(model, x, y(:, 1:5), loss), MPIGRAD_ERROR_SHAPE, 'wrong batch')
  labels = 1
  call expect(mpigrad_train_step(model, x, labels, loss), MPIGRAD_ERROR_DTYPE, 'integer labels')
  call mentions('mse labels must be float')
  call expect(mpigrad_predict(model, x(:, 6:1:-1), p1), MPIGRAD_ERROR_INVALID_ARGUMENT, &
              'a reversed section')
  call mentions('only positive strides')
  call expect(mpigrad_train_step(none, x, y, loss), MPIGRAD_ERROR_INVALID_HANDLE, 'zero handle')
  call expect(mpigrad_load_model(model, "no_such_model.h5"), MPIGRAD_ERROR_FILE, 'missing file')
  call mentions('no_such_model.h5')
  call expect(mpigrad_model_create(none, "[model]" // new_line('a') // "outputs = 3"), &
              MPIGRAD_ERROR_CONFIG, 'config without input_shape')
  call check(len(mpigrad_version()) > 0, 'version')

  ! Every C entry point, with default-kind and c_int64_t integers.
  call expect(mpigrad_copied_bytes(model, bytes), MPIGRAD_SUCCESS, 'copied_bytes')
  call expect(mpigrad_copied_bytes(model, bytes8), MPIGRAD_SUCCESS, 'copied_bytes int64')
  call check(bytes > 0 .and. bytes == bytes8, 'the real(8) input and the section were copied')
  call expect(mpigrad_steps(model, steps), MPIGRAD_SUCCESS, 'steps')
  call expect(mpigrad_steps(model, steps8), MPIGRAD_SUCCESS, 'steps int64')
  call check(steps == 2 .and. steps8 == 2, 'two steps')
  call check(mpigrad_status_name(MPIGRAD_ERROR_FILE) == 'MPIGRAD_ERROR_FILE', 'status_name')
  call expect(mpigrad_set_seed(42), MPIGRAD_SUCCESS, 'set_seed(42)')
  call expect(mpigrad_set_seed(42_c_int64_t), MPIGRAD_SUCCESS, 'set_seed(42_c_int64_t)')
  call expect(mpigrad_set_step_callback(model, c_funloc(on_step), c_null_ptr), MPIGRAD_SUCCESS, &
              'set_step_callback')
  call expect(mpigrad_train_step(model, x, y, loss), MPIGRAD_SUCCESS, 'a step with a callback')
  call check(calls == 1 .and. last_step == 3, 'the callback saw step 3')
  call expect(mpigrad_set_step_callback(model, c_null_funptr, c_null_ptr), MPIGRAD_SUCCESS, &
              'remove the callback')
  call expect(mpigrad_train_step(model, x, y), MPIGRAD_SUCCESS, 'a step without it')
  call check(calls == 1, 'no call after removing it')
  call expect(mpigrad_mean_loss(model, mean), MPIGRAD_SUCCESS, 'mean_loss')
  call expect(mpigrad_train_step_on_stream(model, x, y, c_null_ptr), MPIGRAD_SUCCESS, &
              'train_step_on_stream without a stream')
  call expect(mpigrad_predict_on_stream(model, x, p1, c_loc(mean)), &
              MPIGRAD_ERROR_INVALID_ARGUMENT, 'a stream for a model on the CPU')
  call mentions('stream: a CUDA stream')
  call check(mean > 0, 'the mean loss over the ranks')

  ! Shapes are checked rank and extent: input_shape 1,2,2 is (2, 2, 1) per sample in Fortran.
  call expect(mpigrad_model_create(image, "[model]" // new_line('a') // "name = mlp" // &
              new_line('a') // "input_shape = 1,2,2" // new_line('a') // "outputs = 3" // &
              new_line('a') // "[loss]" // new_line('a') // "name = mse"), MPIGRAD_SUCCESS, &
              'create a model of image samples')
  call expect(mpigrad_train_step(image, x3, y), MPIGRAD_ERROR_SHAPE, &
              'a sample without its channel')
  call mentions('shape (2, 2, 6) in Fortran order is 6 samples of shape (2, 2)')
  call mentions('expected (2, 2, 1, 6) in Fortran order')
  call expect(mpigrad_train_step(image, x, y), MPIGRAD_ERROR_SHAPE, 'a flat sample')
  x4 = reshape(x, [2, 2, 1, 6])
  call expect(mpigrad_train_step(image, x4, y), MPIGRAD_SUCCESS, 'the sample shape')
  call expect(mpigrad_model_destroy(image), MPIGRAD_SUCCESS, 'destroy the image model')

  call expect(mpigrad_model_destroy(other), MPIGRAD_SUCCESS, 'destroy')
  call check(other%id == 0, 'destroy zeroes the handle')
  call expect(mpigrad_model_destroy(model), MPIGRAD_SUCCESS, 'destroy the distributed model')
  ! The host's MPI works after mpigrad's objects are gone.
  call MPI_Allreduce(failures, total, 1, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, ierr)
  if (rank == 0) print '(a, i0, a, i0, a)', 'test_fortran: ', checks, ' checks, ', total, ' failed'
  call MPI_Finalize(ierr)
  if (total /= 0) error stop 1

contains

  subroutine check(condition, what)
    logical, intent(in) :: condition
    character(len=*), intent(in) :: what
    checks = checks + 1
    if (.not. condition) then
      failures = failures + 1
      print '(a, i0, 2a)', '[rank ', rank, '] FAILED: ', what
    end if
  end subroutine check

  subroutine expect(status, expected, what)
    integer(c_int), intent(in) :: status, expected
    character(len=*), intent(in) :: what
    call check(status == expected, what)
    if (status /= expected) print '(a, i0, a, i0, 2a)', '  status ', status, ', expected ', &
        expected, '; last error: ', mpigrad_last_error()
  end subroutine expect

  subroutine mentions(text)
    character(len=*), intent(in) :: text
    call check(index(mpigrad_last_error(), text) > 0, 'the last error mentions "' // text // &
               '": ' // mpigrad_last_error())
  end subroutine mentions

end program test_fortran
