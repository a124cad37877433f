! An MD code that learns its potential on the fly: a Fortran host of mpigrad's atoms calls.
!
! 64 argon-like atoms (Lennard-Jones, reduced units: sigma = epsilon = mass = 1) in a periodic
! cubic box at density 0.8, started on a simple cubic lattice at temperature 1, integrated with
! velocity Verlet (dt = 0.005). The pair potential is shifted so that both the energy and the
! force go to zero at the cutoff rc = 2 (the "shifted-force" form), so the true dynamics
! conserve energy up to the integrator's error.
!
! Phase 1 (learning): the dynamics run on the TRUE forces; every --stride steps the frame
! (positions, the true energy and forces, the cell) goes to mpigrad_atoms_train_step, one
! training step of [loss] energy_force (md_lj.ini: SchNet, energy + 10 x force loss, AdamW).
! Every rank of MPI_COMM_WORLD runs its own trajectory (its own initial velocities) and mpigrad
! averages the gradients over the ranks, so each step learns from one frame per rank.
!
! Phase 2 (using): from the last state of phase 1, NVE dynamics on the LEARNED forces
! (mpigrad_atoms_predict, with mpigrad's own neighbor list of [graph] cutoff). Reported: the
! drift of the total energy (learned potential energy + kinetic energy) over the run, and the
! error of the learned forces against the true potential on the frames the learned dynamics
! visit (RMSE and RMSE relative to the true forces' RMS). For reference the same NVE run is made
! on the true forces from the same start, which gives the integrator's own drift.
!
!   mpirun -np 2 md_lj examples/insitu/md_lj.ini [--frames 200] [--stride 5] [--nve-steps 1000]
!          [--dt 0.005] [--check-force REL] [--check-drift MAX]
!
! With --check-force the program fails unless the relative force RMSE is below REL, and with
! --check-drift unless the largest |E(t) - E(0)| per atom of the learned run is below MAX and
! finite (the CI's short run).
program md_lj
  use, intrinsic :: iso_c_binding
  use mpi_f08
  use mpigrad
  implicit none

  integer, parameter :: side = 4, n = side**3
  real(c_double), parameter :: density = 0.8d0, rc = 2.0d0, start_temperature = 1.0d0
  character(len=4096) :: config
  integer :: frames = 200, stride = 5, nve_steps = 1000, rank, size, frame, k, step
  real(c_double) :: dt = 0.005d0, max_force_error = -1, max_drift = -1
  real(c_double) :: box, cell(3, 3), x(3, n), v(3, n), f(3, n), f_true(3, n)
  real(c_double) :: x0(3, n), v0(3, n), energy, e_true, loss, mean_loss, first_loss = -1
  integer(c_int32_t) :: z(n), pbc(3)
  type(mpigrad_model) :: model
  integer :: status
  real(c_double) :: learned_drift, learned_slope, true_drift, true_slope
  real(c_double) :: sums(5), totals(5), force_rmse, force_rms, energy_offset, energy_spread
  real(c_double) :: seconds
  real(c_double) :: list_difference
  logical :: passed

  call MPI_Init()
  call MPI_Comm_rank(MPI_COMM_WORLD, rank)
  call MPI_Comm_size(MPI_COMM_WORLD, size)
  call parse_arguments()

  box = (dble(n) / density)**(1.0d0 / 3.0d0)
  cell = 0
  do k = 1, 3
    cell(k, k) = box  ! cell(:, i) is the i-th lattice vector
  end do
  pbc = 1
  z = 18  ! argon
  call start(x, v)

  status = mpigrad_model_create_distributed(model, trim(config), MPI_COMM_WORLD, "cpu")
  call check(status, 'creating the model')

  ! Phase 1: dynamics on the true potential, one training step every `stride` steps.
  seconds = MPI_Wtime()
  call lennard_jones(x, energy, f)
  do frame = 1, frames
    do k = 1, stride
      call verlet_true(x, v, f, energy)
    end do
    status = mpigrad_atoms_train_step(model, x, z, energy, f, loss, cell=cell, pbc=pbc)
    call check(status, 'training')
    if (frame == 1 .or. mod(frame, max(1, frames / 5)) == 0) then
      status = mpigrad_mean_loss(model, mean_loss)
      call check(status, 'the mean loss')
      if (first_loss < 0) first_loss = mean_loss
      if (rank == 0) print '(a, i5, a, es10.3, a, f7.3)', 'frame ', frame, '  loss ', mean_loss, &
                                                         '  temperature ', temperature(v)
    end if
  end do
  if (rank == 0) print '(a, i0, a, i0, a, f6.1, a)', 'learned from ', frames * size, &
      ' frames (', size, ' ranks) in ', MPI_Wtime() - seconds, ' s'

  ! The MD code's own neighbor list (a Verlet list, 1-based atom numbers) gives what mpigrad's
  ! does: schnet's filters vanish beyond the cutoff.
  list_difference = host_list_difference()
  if (rank == 0) print '(a, es9.2)', &
      'host neighbor list vs mpigrad''s: largest force difference ', list_difference

  ! Phase 2: NVE on the learned forces, then on the true ones from the same start.
  x0 = x
  v0 = v
  seconds = MPI_Wtime()
  call nve(.true., learned_drift, learned_slope, sums)
  call MPI_Allreduce(sums, totals, 5, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD)
  force_rmse = sqrt(totals(1) / totals(3))
  force_rms = sqrt(totals(2) / totals(3))
  energy_offset = totals(4) / (totals(3) / (3 * n))
  energy_spread = sqrt(max(0d0, totals(5) / (totals(3) / (3 * n)) - energy_offset**2))
  x = x0
  v = v0
  call nve(.false., true_drift, true_slope, sums)
  call MPI_Allreduce(MPI_IN_PLACE, learned_drift, 1, MPI_DOUBLE_PRECISION, MPI_MAX, MPI_COMM_WORLD)
  call MPI_Allreduce(MPI_IN_PLACE, true_drift, 1, MPI_DOUBLE_PRECISION, MPI_MAX, MPI_COMM_WORLD)
  call MPI_Allreduce(MPI_IN_PLACE, learned_slope, 1, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD)
  call MPI_Allreduce(MPI_IN_PLACE, true_slope, 1, MPI_DOUBLE_PRECISION, MPI_SUM, MPI_COMM_WORLD)
  if (rank == 0) then
    print '(a, i0, a, f7.2, a, f6.1, a)', 'NVE on the learned forces: ', nve_steps, &
        ' steps (t = ', nve_steps * dt, ' tau) in ', MPI_Wtime() - seconds, ' s, both runs'
    print '(a, es10.3, a, es10.3, a)', '  force RMSE vs the true potential ', force_rmse, &
        ' (true forces RMS ', force_rms, ')'
    print '(a, f7.4)', '  relative force RMSE                 ', force_rmse / force_rms
    print '(a, es10.3, a, es10.3)', '  energy error per atom: mean        ', energy_offset, &
        '   standard deviation ', energy_spread
    print '(a, es10.3, a, es10.3)', '  learned: max |E(t) - E(0)| per atom ', learned_drift, &
        '   drift per atom per tau ', learned_slope / size
    print '(a, es10.3, a, es10.3)', '  true:    max |E(t) - E(0)| per atom ', true_drift, &
        '   drift per atom per tau ', true_slope / size
  end if

  passed = list_difference < 1d-4
  if (max_force_error > 0) passed = passed .and. force_rmse / force_rms < max_force_error
  if (max_drift > 0) then
    passed = passed .and. learned_drift == learned_drift .and. learned_drift < max_drift
  end if
  if (max_force_error > 0 .or. max_drift > 0) then
    if (rank == 0) print '(a, l1, a, es9.2, a, es9.2, a)', 'check passed: ', passed, &
        '  (relative force RMSE bound ', max_force_error, ', drift bound ', max_drift, ')'
  end if
  status = mpigrad_model_destroy(model)
  call MPI_Finalize()
  if (.not. passed) error stop 1

contains

  subroutine parse_arguments()
    character(len=4096) :: argument, value
    integer :: i
    call get_command_argument(1, config)
    if (len_trim(config) == 0) then
      if (rank == 0) print '(a)', 'usage: md_lj CONFIG [--frames N] [--stride K] [--nve-steps M] &
          &[--dt DT] [--check-force REL] [--check-drift MAX]'
      call MPI_Abort(MPI_COMM_WORLD, 2)
    end if
    i = 2
    do while (i <= command_argument_count())
      call get_command_argument(i, argument)
      call get_command_argument(i + 1, value)
      select case (trim(argument))
      case ('--frames')
        read (value, *) frames
      case ('--stride')
        read (value, *) stride
      case ('--nve-steps')
        read (value, *) nve_steps
      case ('--dt')
        read (value, *) dt
      case ('--check-force')
        read (value, *) max_force_error
      case ('--check-drift')
        read (value, *) max_drift
      case default
        if (rank == 0) print '(2a)', 'md_lj: unknown argument ', trim(argument)
        call MPI_Abort(MPI_COMM_WORLD, 2)
      end select
      i = i + 2
    end do
  end subroutine parse_arguments

  subroutine check(code, what)
    integer, intent(in) :: code
    character(len=*), intent(in) :: what
    if (code == MPIGRAD_SUCCESS) return
    print '(a, i0, 4a)', 'md_lj: rank ', rank, ': ', what, ': ', mpigrad_last_error()
    call MPI_Abort(MPI_COMM_WORLD, 1)
  end subroutine check

  ! A simple cubic lattice, and velocities of temperature start_temperature drawn from this
  ! rank's seed, without net momentum.
  subroutine start(x, v)
    real(c_double), intent(out) :: x(3, n), v(3, n)
    integer :: i, j, l, a
    integer(c_int64_t) :: state
    real(c_double) :: u1, u2
    a = 0
    do i = 0, side - 1
      do j = 0, side - 1
        do l = 0, side - 1
          a = a + 1
          x(:, a) = ([i, j, l] + 0.5d0) * box / side
        end do
      end do
    end do
    state = 12345_c_int64_t + 7919_c_int64_t * rank
    do a = 1, n
      do i = 1, 3
        u1 = uniform(state)
        u2 = uniform(state)
        v(i, a) = sqrt(-2 * log(max(u1, 1d-12))) * cos(2 * acos(-1.0d0) * u2)
      end do
    end do
    do i = 1, 3
      v(i, :) = v(i, :) - sum(v(i, :)) / n
    end do
    v = v * sqrt(start_temperature / temperature(v))
  end subroutine start

  function uniform(state) result(u)
    integer(c_int64_t), intent(inout) :: state
    real(c_double) :: u
    state = ieor(state, ishft(state, 13))
    state = ieor(state, ishft(state, -7))
    state = ieor(state, ishft(state, 17))
    u = dble(iand(ishft(state, -11), 2_c_int64_t**52 - 1)) / 2.0d0**52
  end function uniform

  function temperature(v) result(t)
    real(c_double), intent(in) :: v(3, n)
    real(c_double) :: t
    t = sum(v * v) / (3 * n - 3)
  end function temperature

  ! The shifted-force Lennard-Jones energy and forces, by the minimum image (rc < box / 2).
  subroutine lennard_jones(x, energy, f)
    real(c_double), intent(in) :: x(3, n)
    real(c_double), intent(out) :: energy, f(3, n)
    real(c_double) :: d(3), r2, r, inv6, dv, v_rc, dv_rc
    integer :: i, j
    inv6 = 1 / rc**6
    v_rc = 4 * (inv6 * inv6 - inv6)
    dv_rc = (-48 * inv6 * inv6 + 24 * inv6) / rc
    energy = 0
    f = 0
    do i = 1, n - 1
      do j = i + 1, n
        d = x(:, j) - x(:, i)
        d = d - box * anint(d / box)
        r2 = sum(d * d)
        if (r2 >= rc * rc) cycle
        r = sqrt(r2)
        inv6 = 1 / (r2 * r2 * r2)
        energy = energy + 4 * (inv6 * inv6 - inv6) - v_rc - (r - rc) * dv_rc
        dv = (-48 * inv6 * inv6 + 24 * inv6) / r - dv_rc
        f(:, j) = f(:, j) - dv * d / r
        f(:, i) = f(:, i) + dv * d / r
      end do
    end do
  end subroutine lennard_jones

  ! Atoms back into the box [0, box)^3, as MD codes keep them.
  subroutine wrap(x)
    real(c_double), intent(inout) :: x(3, n)
    x = x - box * floor(x / box)
  end subroutine wrap

  subroutine verlet_true(x, v, f, energy)
    real(c_double), intent(inout) :: x(3, n), v(3, n), f(3, n)
    real(c_double), intent(out) :: energy
    v = v + 0.5d0 * dt * f
    x = x + dt * v
    call wrap(x)
    call lennard_jones(x, energy, f)
    v = v + 0.5d0 * dt * f
  end subroutine verlet_true

  subroutine learned(x, energy, f)
    real(c_double), intent(in) :: x(3, n)
    real(c_double), intent(out) :: energy, f(3, n)
    integer :: code
    code = mpigrad_atoms_predict(model, x, z, energy, f, cell=cell, pbc=pbc)
    call check(code, 'predicting')
  end subroutine learned

  ! The learned forces on the host's list (pairs within rc + 0.1 by the minimum image, with the
  ! image shifts) against those on mpigrad's radius graph: the largest difference.
  function host_list_difference() result(difference)
    real(c_double) :: difference, f_ours(3, n), f_host(3, n), e_ours, e_host, d(3)
    integer(c_int32_t), allocatable :: pairs(:, :)
    real(c_double), allocatable :: shifts(:, :)
    integer :: i, j, edges, code
    allocate(pairs(n * n, 2), shifts(3, n * n))
    edges = 0
    do j = 1, n
      do i = 1, n
        if (i == j) cycle
        d = x(:, j) - x(:, i)
        if (sum((d - box * anint(d / box))**2) >= (rc + 0.1d0)**2) cycle
        edges = edges + 1
        pairs(edges, :) = [i, j]  ! source, target
        shifts(:, edges) = -box * anint(d / box)
      end do
    end do
    call learned(x, e_ours, f_ours)
    code = mpigrad_atoms_predict(model, x, z, e_host, f_host, cell=cell, pbc=pbc, &
                                 edge_index=pairs(1:edges, :), edge_shifts=shifts(:, 1:edges))
    call check(code, 'predicting on the host''s neighbor list')
    difference = max(maxval(abs(f_host - f_ours)), abs(e_host - e_ours) / n)
  end function host_list_difference

  ! nve_steps of velocity Verlet on the learned (or true) forces from (x, v). drift: the largest
  ! |E(t) - E(0)| per atom; slope: the least-squares slope of E(t) per atom, per tau. On the
  ! learned run, sums gets the squared force error, the squared true forces, the force
  ! components, and the energy error per atom summed and squared, over every 10th frame.
  subroutine nve(use_model, drift, slope, sums)
    logical, intent(in) :: use_model
    real(c_double), intent(out) :: drift, slope, sums(5)
    real(c_double) :: e0, total, t, st, se, stt, ste
    integer :: samples
    if (use_model) then
      call learned(x, energy, f)
    else
      call lennard_jones(x, energy, f)
    end if
    e0 = energy + 0.5d0 * sum(v * v)
    drift = 0
    sums = 0
    st = 0
    se = 0
    stt = 0
    ste = 0
    samples = 0
    do step = 1, nve_steps
      v = v + 0.5d0 * dt * f
      x = x + dt * v
      call wrap(x)
      if (use_model) then
        call learned(x, energy, f)
      else
        call lennard_jones(x, energy, f)
      end if
      v = v + 0.5d0 * dt * f
      total = energy + 0.5d0 * sum(v * v)
      drift = max(drift, abs(total - e0) / n)
      if (total /= total) drift = total  ! NaN: the run blew up
      t = step * dt
      st = st + t
      se = se + (total - e0) / n
      stt = stt + t * t
      ste = ste + t * (total - e0) / n
      samples = samples + 1
      if (use_model .and. mod(step, 10) == 0) then
        call lennard_jones(x, e_true, f_true)
        sums(1) = sums(1) + sum((f - f_true)**2)
        sums(2) = sums(2) + sum(f_true**2)
        sums(3) = sums(3) + 3 * n
        sums(4) = sums(4) + (energy - e_true) / n
        sums(5) = sums(5) + ((energy - e_true) / n)**2
      end if
    end do
    slope = (samples * ste - st * se) / (samples * stt - st * st)
  end subroutine nve

end program md_lj
