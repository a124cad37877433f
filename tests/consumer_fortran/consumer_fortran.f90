! Uses the installed Fortran module: a linear model learns y = 2x - 1 on 2 features' sum,
! data-parallel over MPI_COMM_WORLD (one rank here), with mpi_f08's type(MPI_Comm).
program consumer_fortran
  use, intrinsic :: iso_c_binding
  use mpi_f08
  use mpigrad
  implicit none
  type(mpigrad_model) :: model
  real(c_float) :: x(2, 16), y(1, 16)
  real(c_double) :: first, loss
  integer :: i, step
  call MPI_Init()
  if (mpigrad_model_create_distributed(model, "[model]" // new_line('a') // "name = mlp" // &
      new_line('a') // "hidden =" // new_line('a') // "input_shape = 2" // new_line('a') // &
      "outputs = 1" // new_line('a') // "[loss]" // new_line('a') // "name = mse" // &
      new_line('a') // "[optim]" // new_line('a') // "lr = 0.1" // new_line('a') // &
      "momentum = 0", MPI_COMM_WORLD) /= MPIGRAD_SUCCESS) then
    print *, mpigrad_last_error()
    error stop 1
  end if
  do i = 1, 16
    x(:, i) = [real(i, c_float) / 32, real(i, c_float) / 32]
    y(1, i) = 2 * (x(1, i) + x(2, i)) - 1
  end do
  do step = 1, 1000
    if (mpigrad_train_step(model, x, y, loss) /= MPIGRAD_SUCCESS) error stop 2
    if (step == 1) first = loss
  end do
  print '(3a, es10.3, a, es10.3)', 'mpigrad ', mpigrad_version(), ' from Fortran: loss ', first, &
      ' -> ', loss
  if (mpigrad_model_destroy(model) /= MPIGRAD_SUCCESS) error stop 3
  call MPI_Finalize()
  if (loss > 1e-3 * first) error stop 4
end program consumer_fortran
