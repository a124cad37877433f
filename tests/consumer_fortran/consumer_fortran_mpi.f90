! Uses the installed Fortran module from a `use mpi` host (integer communicators, no mpi_f08),
! under mpiexec with any number of ranks: a data-parallel model on a sub-communicator (even and
! odd ranks), the mean loss over its ranks, default-kind integers, wrong shapes and a bad config
! on one rank as errors on every rank, and the host's MPI working after the model is destroyed.
program consumer_fortran_mpi
  use, intrinsic :: iso_c_binding
  use mpi
  use mpigrad
  implicit none
  type(mpigrad_model) :: model, broken
  real(c_float) :: x(2, 8), y(1, 8), flat(4, 8)
  real(c_double) :: loss, mean, total_loss
  integer :: ierr, rank, size, halves, group_rank, group_size, i, step, steps, bytes
  integer :: failures = 0, total
  character(len=*), parameter :: nl = new_line('a')
  character(len=*), parameter :: config = "[model]" // nl // "name = mlp" // nl // &
      "hidden = 8" // nl // "input_shape = 2" // nl // "outputs = 1" // nl // "[loss]" // nl // &
      "name = mse" // nl // "[optim]" // nl // "name = adam" // nl // "lr = 0.01"

  call MPI_Init(ierr)
  call MPI_Comm_rank(MPI_COMM_WORLD, rank, ierr)
  call MPI_Comm_size(MPI_COMM_WORLD, size, ierr)
  call MPI_Comm_split(MPI_COMM_WORLD, mod(rank, 2), rank, halves, ierr)
  call MPI_Comm_rank(halves, group_rank, ierr)
  call MPI_Comm_size(halves, group_size, ierr)

  call check(mpigrad_set_seed(42) == MPIGRAD_SUCCESS, 'set_seed with a default integer')
  call check(mpigrad_model_create_distributed(model, config, halves) == MPIGRAD_SUCCESS, &
             'create on a sub-communicator')
  do step = 1, 20
    do i = 1, 8
      x(:, i) = [real(sin(0.3d0 * (8 * step + i)), c_float), real(group_rank, c_float)]
      y(1, i) = x(1, i) * 2 - x(2, i)
    end do
    call check(mpigrad_train_step(model, x, y, loss) == MPIGRAD_SUCCESS, 'train')
  end do
  call check(mpigrad_mean_loss(model, mean) == MPIGRAD_SUCCESS, 'mean_loss')
  call MPI_Allreduce(loss, total_loss, 1, MPI_DOUBLE_PRECISION, MPI_SUM, halves, ierr)
  call check(abs(mean - total_loss / group_size) <= 1d-6 * abs(mean), 'the mean loss')
  call check(mpigrad_steps(model, steps) == MPIGRAD_SUCCESS .and. steps == 20, 'steps')
  call check(mpigrad_copied_bytes(model, bytes) == MPIGRAD_SUCCESS .and. bytes == 0, &
             'copied_bytes')

  ! Errors: a wrong shape names both shapes in Fortran order; a bad config on one rank fails
  ! on every rank.
  flat = 0
  call check(mpigrad_train_step(model, flat, y) == MPIGRAD_ERROR_SHAPE, 'a wrong shape')
  call check(index(mpigrad_last_error(), '(4, 8) in Fortran order') > 0, 'the shape, in order')
  call check(mpigrad_status_name(MPIGRAD_ERROR_SHAPE) == 'MPIGRAD_ERROR_SHAPE', 'status_name')
  if (rank == size - 1) then
    ierr = mpigrad_model_create_distributed(broken, "[model]" // nl // "name = x", MPI_COMM_WORLD)
  else
    ierr = mpigrad_model_create_distributed(broken, config, MPI_COMM_WORLD)
  end if
  call check(ierr == MPIGRAD_ERROR_CONFIG, 'a bad config on one rank')

  call check(mpigrad_model_destroy(model) == MPIGRAD_SUCCESS, 'destroy')
  call MPI_Comm_free(halves, ierr)
  call MPI_Allreduce(failures, total, 1, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD, ierr)
  if (rank == 0) print '(a, i0, a, i0, a)', 'consumer_fortran_mpi on ', size, ' ranks: ', total, &
      ' failed'
  call MPI_Finalize(ierr)
  if (total /= 0) error stop 1

contains

  subroutine check(condition, what)
    logical, intent(in) :: condition
    character(len=*), intent(in) :: what
    if (.not. condition) then
      failures = failures + 1
      print '(a, i0, 4a)', '[rank ', rank, '] FAILED: ', what, '; last error: ', &
          mpigrad_last_error()
    end if
  end subroutine check

end program consumer_fortran_mpi
