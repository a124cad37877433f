! The atoms calls from Fortran, one process: positions(3, n) in real(8) and real(4), a scalar
! energy for one structure and energy(2) for a batch of two (num_atoms, cell(3, 3, 2), pbc(3, 2)),
! which gives each structure's single result; the host's neighbor list as pairs(edges, 2) of
! 1-based atom numbers gives mpigrad's; training steps on fixed labels lower the loss; wrong
! shapes, an unknown atomic number, a neighbor list laid out (2, edges) and a model that is not a
! potential give their codes and messages.
program test_fortran_atoms
  use, intrinsic :: iso_c_binding
  use mpigrad
  implicit none

  integer, parameter :: n = 8
  integer :: failures = 0, checks = 0, i, j, edges, step
  type(mpigrad_model) :: model, mlp
  real(c_double) :: x(3, n), f(3, n), energy, cell(3, 3), both_x(3, 2 * n), both_f(3, 2 * n)
  real(c_double) :: both_cell(3, 3, 2), both_e(2), f_list(3, n), e_list, d(3), shifts(3, n * n)
  real(c_double) :: e_second, f_second(3, n), loss, first_loss, bad(2, n)
  real(c_float) :: x4(3, n), f4(3, n), e4
  integer(c_int32_t) :: z(n), pbc(3), both_z(2 * n), both_pbc(3, 2), counts(2)
  integer(c_int32_t) :: pairs(n * n, 2), wrong(2, n * n)
  character(len=*), parameter :: potential = "[model]" // new_line('a') // "name = schnet" // &
      new_line('a') // "hidden = 8" // new_line('a') // "n_rbf = 6" // new_line('a') // &
      "interactions = 1" // new_line('a') // "[graph]" // new_line('a') // "cutoff = 2.0" // &
      new_line('a') // "[loss]" // new_line('a') // "name = energy_force" // new_line('a') // &
      "[optim]" // new_line('a') // "name = adamw" // new_line('a') // "lr = 0.01" // new_line('a')

  call expect(mpigrad_model_create(model, potential), MPIGRAD_SUCCESS, 'create a potential')
  ! Eight atoms 1.3 apart in a periodic box of side 5, across its faces (some outside the cell).
  do i = 1, n
    x(:, i) = [mod(i, 2), mod(i / 2, 2), mod(i / 4, 2)] * 1.3d0 - 0.6d0 + &
              0.1d0 * sin(1.0d0 * i * [1, 2, 3])
  end do
  z = [(1 + mod(i, 2) * 7, i = 1, n)]
  cell = 0
  do i = 1, 3
    cell(i, i) = 5  ! more than twice the list's reach: the minimum image finds every pair
  end do
  pbc = 1

  call expect(mpigrad_atoms_predict(model, x, z, energy, f, cell=cell, pbc=pbc), MPIGRAD_SUCCESS, &
              'predict one structure')
  call check(energy == energy .and. maxval(abs(f)) > 0, 'an energy and forces')
  ! real(4) positions, energy and forces: the same float32 numbers.
  x4 = real(x, c_float)
  call expect(mpigrad_atoms_predict(model, x4, z, e4, f4, cell=cell, pbc=pbc), MPIGRAD_SUCCESS, &
              'predict in real(4)')
  call check(abs(e4 - energy) <= 1e-6 * (1 + abs(energy)), 'real(4) gives the energy')
  call check(maxval(abs(f4 - f)) <= 1e-6 * (1 + maxval(abs(f))), 'real(4) gives the forces')

  ! Two structures in one call.
  both_x(:, 1:n) = x
  both_x(:, n + 1:) = x * 0.9d0
  both_z(1:n) = z
  both_z(n + 1:) = z
  both_cell(:, :, 1) = cell
  both_cell(:, :, 2) = cell * 0.9d0
  both_pbc = 1
  counts = n
  call expect(mpigrad_atoms_predict(model, both_x, both_z, both_e, both_f, cell=both_cell, &
                                    pbc=both_pbc, num_atoms=counts), MPIGRAD_SUCCESS, &
              'predict two structures')
  call expect(mpigrad_atoms_predict(model, x * 0.9d0, z, e_second, f_second, cell=cell * 0.9d0, &
                                    pbc=pbc), MPIGRAD_SUCCESS, 'predict the second alone')
  call check(abs(both_e(1) - energy) <= 1e-5 * (1 + abs(energy)), 'the batch: first energy')
  call check(abs(both_e(2) - e_second) <= 1e-5 * (1 + abs(e_second)), 'the batch: second energy')
  call check(maxval(abs(both_f(:, 1:n) - f)) <= 1e-5, 'the batch: first forces')
  call check(maxval(abs(both_f(:, n + 1:) - f_second)) <= 1e-5, 'the batch: second forces')

  ! The host's neighbor list: pairs(edges, 2), column 1 the sources, 1-based.
  edges = 0
  do j = 1, n
    do i = 1, n
      if (i == j) cycle
      d = x(:, j) - x(:, i)
      if (sum((d - 5 * anint(d / 5))**2) >= 2.2d0**2) cycle
      edges = edges + 1
      pairs(edges, :) = [i, j]
      shifts(:, edges) = -5 * anint(d / 5)
    end do
  end do
  call expect(mpigrad_atoms_predict(model, x, z, e_list, f_list, cell=cell, &
                                    edge_index=pairs(1:edges, :), edge_shifts=shifts(:, 1:edges)), &
              MPIGRAD_SUCCESS, 'predict on the host''s list')
  call check(abs(e_list - energy) <= 1e-5 * (1 + abs(energy)), 'the host''s list: the energy')
  call check(maxval(abs(f_list - f)) <= 1e-5 * (1 + maxval(abs(f))), 'the host''s list: forces')
  wrong(:, 1:edges) = transpose(pairs(1:edges, :))
  call expect(mpigrad_atoms_predict(model, x, z, e_list, f_list, cell=cell, &
                                    edge_index=wrong(:, 1:edges)), MPIGRAD_ERROR_SHAPE, &
              'a list laid out (2, edges)')
  call mentions('edge_index(edges, 2) in Fortran')

  ! Training on the structure's own (scaled) forces: the loss falls.
  f = 0.5d0 * f
  energy = energy - 1
  do step = 1, 20
    call expect(mpigrad_atoms_train_step(model, x, z, energy, f, loss, cell=cell, pbc=pbc), &
                MPIGRAD_SUCCESS, 'train_step')
    if (step == 1) first_loss = loss
  end do
  call check(loss < 0.5d0 * first_loss, 'the loss falls')

  ! Errors.
  bad = 0
  call expect(mpigrad_atoms_predict(model, bad, z, energy, f), MPIGRAD_ERROR_SHAPE, &
              'positions(2, n)')
  call mentions('positions: shape [8, 2]')
  z(3) = 200
  call expect(mpigrad_atoms_predict(model, x, z, energy, f), MPIGRAD_ERROR_INVALID_ARGUMENT, &
              'an unknown atomic number')
  call mentions('atomic_numbers[2] is 200')
  z(3) = 1
  call expect(mpigrad_atoms_train_step(model, x, z, energy, f(:, 1:4)), MPIGRAD_ERROR_SHAPE, &
              'forces of 4 atoms')
  call mentions('forces: shape [4, 3]')
  call expect(mpigrad_model_create(mlp, "[model]" // new_line('a') // "name = mlp" // &
                                   new_line('a') // "input_shape = 3" // new_line('a') // &
                                   "outputs = 1" // new_line('a') // "[loss]" // new_line('a') // &
                                   "name = mse"), MPIGRAD_SUCCESS, 'create an mlp')
  call expect(mpigrad_atoms_predict(mlp, x, z, energy, f), MPIGRAD_ERROR_CONFIG, 'an mlp')
  call mentions('energy_force')
  call expect(mpigrad_model_destroy(mlp), MPIGRAD_SUCCESS, 'destroy the mlp')
  call expect(mpigrad_model_destroy(model), MPIGRAD_SUCCESS, 'destroy')

  print '(a, i0, a, i0, a)', 'fortran_atoms: ', checks, ' checks, ', failures, ' failed'
  if (failures > 0) error stop 1

contains

  subroutine check(condition, what)
    logical, intent(in) :: condition
    character(len=*), intent(in) :: what
    checks = checks + 1
    if (condition) return
    failures = failures + 1
    print '(2a)', 'FAILED: ', what
  end subroutine check

  subroutine expect(status, expected, what)
    integer, intent(in) :: status, expected
    character(len=*), intent(in) :: what
    call check(status == expected, what)
    if (status /= expected) print '(4a)', '  got ', mpigrad_status_name(status), ': ', &
                                          mpigrad_last_error()
  end subroutine expect

  subroutine mentions(text)
    character(len=*), intent(in) :: text
    call check(index(mpigrad_last_error(), text) > 0, 'the error mentions "' // text // '"')
    if (index(mpigrad_last_error(), text) == 0) print '(2a)', '  error: ', mpigrad_last_error()
  end subroutine mentions

end program test_fortran_atoms
