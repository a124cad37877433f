! The Fortran module from an `mpi_f08` host, under mpirun: type(MPI_Comm) communicators, the
! world and a sub-communicator (even and odd ranks), R ranks on R parts of a batch ending with
! one process's weights, the mean loss over the ranks, and the host's MPI working afterwards.
program test_fortran_f08
  use, intrinsic :: iso_c_binding
  use mpi_f08
  use mpigrad
  implicit none
  type(MPI_Comm) :: halves
  type(mpigrad_model) :: world, half, reference
  real(c_float) :: x(2, 8), y(1, 8), probe(2, 1), p_world(1, 1), p_half(1, 1), p_reference(1, 1)
  real(c_double) :: loss, mean, total
  integer :: rank, size, group_rank, group_size, step, i, part, failures = 0, all_failures
  character(len=*), parameter :: nl = new_line('a')
  character(len=*), parameter :: config = "[model]" // nl // "name = mlp" // nl // &
      "hidden = 8" // nl // "input_shape = 2" // nl // "outputs = 1" // nl // "[loss]" // nl // &
      "name = mse" // nl // "[optim]" // nl // "name = adam" // nl // "lr = 0.01"

  call MPI_Init()
  call MPI_Comm_rank(MPI_COMM_WORLD, rank)
  call MPI_Comm_size(MPI_COMM_WORLD, size)
  call MPI_Comm_split(MPI_COMM_WORLD, mod(rank, 2), rank, halves)
  call MPI_Comm_rank(halves, group_rank)
  call MPI_Comm_size(halves, group_size)
  call check(mpigrad_model_create_distributed(world, config, MPI_COMM_WORLD, "cpu") == &
             MPIGRAD_SUCCESS, 'create on type(MPI_Comm) MPI_COMM_WORLD')
  call check(mpigrad_model_create_distributed(half, config, halves) == MPIGRAD_SUCCESS, &
             'create on a type(MPI_Comm) sub-communicator')
  call check(mpigrad_model_create(reference, config) == MPIGRAD_SUCCESS, 'create')
  do step = 1, 10
    do i = 1, 8
      x(:, i) = [real(sin(0.4d0 * (8 * step + i)), c_float), real(cos(0.9d0 * i), c_float)]
      y(1, i) = x(1, i) * x(2, i)
    end do
    part = 8 / size
    call check(mpigrad_train_step(world, x(:, rank * part + 1:(rank + 1) * part), &
                                  y(:, rank * part + 1:(rank + 1) * part), loss) == &
               MPIGRAD_SUCCESS, 'train on the world')
    part = 8 / group_size
    call check(mpigrad_train_step(half, x(:, group_rank * part + 1:(group_rank + 1) * part), &
                                  y(:, group_rank * part + 1:(group_rank + 1) * part)) == &
               MPIGRAD_SUCCESS, 'train on the halves')
    call check(mpigrad_train_step(reference, x, y) == MPIGRAD_SUCCESS, 'train alone')
  end do
  probe = reshape([0.3_c_float, -0.2_c_float], [2, 1])
  call check(mpigrad_predict(world, probe, p_world) == MPIGRAD_SUCCESS, 'predict')
  call check(mpigrad_predict(half, probe, p_half) == MPIGRAD_SUCCESS, 'predict')
  call check(mpigrad_predict(reference, probe, p_reference) == MPIGRAD_SUCCESS, 'predict')
  call check(abs(p_world(1, 1) - p_reference(1, 1)) < 1e-5, 'the world = one process')
  call check(abs(p_half(1, 1) - p_reference(1, 1)) < 1e-5, 'a sub-communicator = one process')
  ! The loss over the world's ranks, against the host's own average of each rank's loss.
  call check(mpigrad_mean_loss(world, mean) == MPIGRAD_SUCCESS, 'mean_loss')
  call MPI_Allreduce(loss, total, 1, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD)
  call check(abs(mean - total / size) <= 1d-6 * abs(mean), 'the mean loss over the ranks')

  call check(mpigrad_model_destroy(world) == MPIGRAD_SUCCESS, 'destroy')
  call check(mpigrad_model_destroy(half) == MPIGRAD_SUCCESS, 'destroy')
  call check(mpigrad_model_destroy(reference) == MPIGRAD_SUCCESS, 'destroy')
  call MPI_Comm_free(halves)
  call MPI_Allreduce(failures, all_failures, 1, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD)
  if (rank == 0) print '(a, i0, a, i0, a)', 'test_fortran_f08 on ', size, ' ranks: ', &
      all_failures, ' failed'
  call MPI_Finalize()
  if (all_failures /= 0) error stop 1

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

end program test_fortran_f08
