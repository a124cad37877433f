! In-situ training from a running MPI "simulation", after TorchFort's online-training example:
! 2-D periodic linear advection on a 32 x 32 grid over [-1, 1]^2, with the analytic solution
!     u(x, y, t) = sin(pi (x - a_x t)) sin(pi (y - a_y t)),   a = (1, 0.5),
! sampled every dt = 0.01. A model learns online to map u to its divergence
!     div(a u) = a_x du/dx + a_y du/dy.
!
! Every rank of MPI_COMM_WORLD owns a slab of grid rows (y) and computes its part of each
! sample. The training ranks (the first --train-ranks, default all) form a communicator of
! their own (MPI_Comm_split), on which mpigrad trains data-parallel. Each step takes a global
! batch of 16 consecutive samples: MPI_Alltoallv sends every slab of sample s to training rank
! mod(s, T), so each training rank holds 16 / T whole fields, and mpigrad averages the
! gradients over the training ranks. After training, 100 fresh samples are gathered on rank 0,
! which reports the relative L2 error of the predicted divergence.
!
!   mpirun -np 4 advection CONFIG [--steps N] [--train-ranks T] [--check MAX_ERROR]
!
! With --check the program exits with an error unless the loss fell and the validation error
! is below MAX_ERROR (the CI's short runs).
program advection
  use, intrinsic :: iso_c_binding
  use mpi_f08
  use mpigrad
  implicit none

  integer, parameter :: n = 32, batch = 16, validation_samples = 100
  real(c_double), parameter :: pi = acos(-1.0d0), a_x = 1.0d0, a_y = 0.5d0, dt = 0.01d0
  character(len=4096) :: config, argument, config_value
  integer :: steps = 1000, train_ranks = -1, rank, size, i, step, log_every
  integer :: status = MPIGRAD_SUCCESS
  real(c_double) :: max_error = -1, loss, first_loss = -1, last_losses = 0, error
  integer :: last_count = 0
  integer, allocatable :: row_begin(:), row_count(:)
  type(MPI_Comm) :: training
  type(mpigrad_model) :: model
  logical :: trains, passed
  integer :: check_sum

  call MPI_Init()
  call MPI_Comm_rank(MPI_COMM_WORLD, rank)
  call MPI_Comm_size(MPI_COMM_WORLD, size)
  call parse_arguments()
  if (train_ranks < 1) train_ranks = size
  if (train_ranks > size .or. mod(batch, train_ranks) /= 0) then
    if (rank == 0) print '(a, i0, a)', 'advection: --train-ranks must divide the batch of 16 and &
        &be at most the ', size, ' ranks'
    call MPI_Abort(MPI_COMM_WORLD, 2)
  end if

  ! The slab decomposition: rank r owns grid rows row_begin(r) .. row_begin(r) + row_count(r) - 1.
  allocate(row_begin(0:size - 1), row_count(0:size - 1))
  do i = 0, size - 1
    row_begin(i) = i * n / size + 1
    row_count(i) = (i + 1) * n / size - i * n / size
  end do

  ! The training ranks' own communicator; mpigrad duplicates it and trains on the duplicate.
  trains = rank < train_ranks
  if (trains) then
    call MPI_Comm_split(MPI_COMM_WORLD, 0, rank, training)
    status = mpigrad_model_create_distributed(model, trim(config), training, "cpu")
    call check(status, 'creating the model')
  else
    call MPI_Comm_split(MPI_COMM_WORLD, MPI_UNDEFINED, rank, training)
  end if
  ! Every rank learns whether creation worked on the training ranks (else all stop).
  call MPI_Allreduce(merge(0, 1, .not. trains .or. status == MPIGRAD_SUCCESS), check_sum, 1, &
                     MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD)
  if (check_sum /= 0) call MPI_Abort(MPI_COMM_WORLD, 1)

  log_every = max(1, steps / 10)
  do step = 1, steps
    call train_step(step, loss)
    if (trains) then
      if (step == 1) first_loss = loss
      if (step > steps - 10) then
        last_losses = last_losses + loss
        last_count = last_count + 1
      end if
      if (rank == 0 .and. mod(step, log_every) == 0) print '(a, i6, a, es12.4)', 'step ', step, &
          '  loss ', loss
    end if
  end do

  call validate(steps * batch, error)
  if (rank == 0) then
    print '(a, es12.4, a, es12.4)', 'loss: first ', first_loss, ', mean of the last 10 ', &
        last_losses / last_count
    print '(a, es12.4, a, i0, a)', 'validation: relative L2 error of the predicted divergence ', &
        error, ' (', validation_samples, ' fresh samples)'
  end if
  passed = .true.
  if (rank == 0 .and. max_error > 0) then
    passed = error < max_error .and. last_losses / last_count < 0.5d0 * first_loss
    if (.not. passed) print '(a, es12.4)', 'advection: FAILED the check; maximal error ', max_error
  end if
  call MPI_Bcast(passed, 1, MPI_LOGICAL, 0, MPI_COMM_WORLD)

  if (trains) then
    call check(mpigrad_model_destroy(model), 'destroying the model')
    call MPI_Comm_free(training)
  end if
  ! The host's own MPI is untouched by mpigrad: a last collective on MPI_COMM_WORLD.
  call MPI_Allreduce(1, check_sum, 1, MPI_INTEGER, MPI_SUM, MPI_COMM_WORLD)
  if (check_sum /= size) passed = .false.
  deallocate(row_begin, row_count)  ! a main program's arrays are never freed for it
  call MPI_Finalize()
  if (.not. passed) error stop 1

contains

  subroutine parse_arguments()
    integer :: k, io
    if (command_argument_count() < 1) then
      if (rank == 0) print '(a)', 'usage: advection CONFIG [--steps N] [--train-ranks T] &
          &[--check MAX_ERROR]'
      call MPI_Abort(MPI_COMM_WORLD, 2)
    end if
    call get_command_argument(1, config)
    k = 2
    do while (k <= command_argument_count())
      call get_command_argument(k, argument)
      select case (trim(argument))
      case ('--steps', '--train-ranks', '--check')
        call get_command_argument(k + 1, config_value)
        io = 1
        if (k + 1 <= command_argument_count()) then
          select case (trim(argument))
          case ('--steps')
            read (config_value, *, iostat=io) steps
          case ('--train-ranks')
            read (config_value, *, iostat=io) train_ranks
          case default
            read (config_value, *, iostat=io) max_error
          end select
        end if
        if (io /= 0) then
          if (rank == 0) print '(4a)', 'advection: ', trim(argument), ' needs a number, got ', &
              trim(config_value)
          call MPI_Abort(MPI_COMM_WORLD, 2)
        end if
      case default
        if (rank == 0) print '(3a)', 'advection: unknown argument ', trim(argument)
        call MPI_Abort(MPI_COMM_WORLD, 2)
      end select
      k = k + 2
    end do
  end subroutine parse_arguments

  subroutine check(code, what)
    integer, intent(in) :: code
    character(len=*), intent(in) :: what
    if (code /= MPIGRAD_SUCCESS) then
      print '(a, i0, 4a)', '[rank ', rank, '] advection: ', what, ': ', mpigrad_last_error()
      call MPI_Abort(MPI_COMM_WORLD, 1)
    end if
  end subroutine check

  ! This rank's rows of sample `sample` (time sample * dt): u and its divergence.
  subroutine simulate(sample, u, divergence)
    integer, intent(in) :: sample
    real(c_float), intent(out) :: u(n, row_count(rank)), divergence(n, row_count(rank))
    real(c_double) :: t, x, y
    integer :: ix, iy
    t = sample * dt
    do iy = 1, row_count(rank)
      y = -1 + 2 * dble(row_begin(rank) + iy - 2) / n
      do ix = 1, n
        x = -1 + 2 * dble(ix - 1) / n
        u(ix, iy) = real(sin(pi * (x - a_x * t)) * sin(pi * (y - a_y * t)), c_float)
        divergence(ix, iy) = real(pi * (a_x * cos(pi * (x - a_x * t)) * sin(pi * (y - a_y * t)) &
                                      + a_y * sin(pi * (x - a_x * t)) * cos(pi * (y - a_y * t))), &
                                  c_float)
      end do
    end do
  end subroutine simulate

  ! Simulates the step's 16 samples, sends each slab to the sample's training rank, and trains.
  subroutine train_step(step, loss)
    integer, intent(in) :: step
    real(c_double), intent(out) :: loss
    integer, parameter :: fields = 2  ! u and its divergence
    integer :: local, mine, s, owner, q, k, offset, slab
    integer :: send_counts(0:size - 1), send_offsets(0:size - 1)
    integer :: receive_counts(0:size - 1), receive_offsets(0:size - 1)
    real(c_float), allocatable :: outgoing(:), incoming(:)
    real(c_float), allocatable :: u(:, :), divergence(:, :), fields_u(:, :, :, :), fields_div(:, :, :, :)

    local = batch / train_ranks
    mine = row_count(rank) * n
    allocate(u(n, row_count(rank)), divergence(n, row_count(rank)), outgoing(fields * mine * batch))
    ! Outgoing, grouped by destination: the samples each training rank owns, in order.
    offset = 0
    send_counts = 0
    do owner = 0, train_ranks - 1
      send_offsets(owner) = offset
      do s = owner, batch - 1, train_ranks
        call simulate((step - 1) * batch + s, u, divergence)
        outgoing(offset + 1:offset + mine) = reshape(u, [mine])
        outgoing(offset + mine + 1:offset + 2 * mine) = reshape(divergence, [mine])
        offset = offset + fields * mine
      end do
      send_counts(owner) = offset - send_offsets(owner)
    end do
    send_offsets(train_ranks:) = offset
    ! Incoming on a training rank: from every rank, its slab of each of my samples.
    receive_counts = 0
    receive_offsets = 0
    offset = 0
    if (trains) then
      do q = 0, size - 1
        receive_offsets(q) = offset
        receive_counts(q) = fields * n * row_count(q) * local
        offset = offset + receive_counts(q)
      end do
    end if
    allocate(incoming(max(offset, 1)))
    call MPI_Alltoallv(outgoing, send_counts, send_offsets, MPI_REAL, incoming, receive_counts, &
                       receive_offsets, MPI_REAL, MPI_COMM_WORLD)
    if (.not. trains) return

    ! Whole fields: (x, y, channel, sample), the batch last, as mpigrad reads Fortran arrays.
    allocate(fields_u(n, n, 1, local), fields_div(n, n, 1, local))
    do q = 0, size - 1
      slab = n * row_count(q)
      offset = receive_offsets(q)
      do k = 1, local
        fields_u(:, row_begin(q):row_begin(q) + row_count(q) - 1, 1, k) = &
            reshape(incoming(offset + 1:offset + slab), [n, row_count(q)])
        fields_div(:, row_begin(q):row_begin(q) + row_count(q) - 1, 1, k) = &
            reshape(incoming(offset + slab + 1:offset + 2 * slab), [n, row_count(q)])
        offset = offset + fields * slab
      end do
    end do
    call check(mpigrad_train_step(model, fields_u, fields_div, loss), 'training')
  end subroutine train_step

  ! Gathers 100 fresh samples (after the training ones) on rank 0, which predicts them and
  ! returns the relative L2 error of the predicted divergence over all of them.
  subroutine validate(first_sample, error)
    integer, intent(in) :: first_sample
    real(c_double), intent(out) :: error
    real(c_float), allocatable :: u(:, :), divergence(:, :)
    real(c_float), allocatable :: whole_u(:, :, :, :), whole_div(:, :, :, :), predicted(:, :, :, :)
    integer :: counts(0:size - 1), offsets(0:size - 1), k
    allocate(u(n, row_count(rank)), divergence(n, row_count(rank)))
    allocate(whole_u(n, n, 1, validation_samples), whole_div(n, n, 1, validation_samples))
    allocate(predicted(n, n, 1, validation_samples))
    counts = n * row_count
    offsets = n * (row_begin - 1)
    do k = 1, validation_samples
      call simulate(first_sample + k - 1, u, divergence)
      call MPI_Gatherv(u, n * row_count(rank), MPI_REAL, whole_u(:, :, 1, k), counts, offsets, &
                       MPI_REAL, 0, MPI_COMM_WORLD)
      call MPI_Gatherv(divergence, n * row_count(rank), MPI_REAL, whole_div(:, :, 1, k), counts, &
                       offsets, MPI_REAL, 0, MPI_COMM_WORLD)
    end do
    error = 0
    if (rank == 0) then
      call check(mpigrad_predict(model, whole_u, predicted), 'predicting')
      error = sqrt(sum(dble(predicted - whole_div)**2) / sum(dble(whole_div)**2))
    end if
  end subroutine validate

end program advection
