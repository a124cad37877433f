! The Fortran module `mpigrad`: in-situ training from Fortran simulation codes, over the C API
! (mpigrad/mpigrad_c.h), with gfortran.
!
!   use mpigrad
!   type(mpigrad_model) :: model
!   real(c_float) :: u(32, 32, 1, 16), du(32, 32, 1, 16)   ! (x, y, channel, sample)
!   real(c_double) :: loss
!   if (mpigrad_model_create_distributed(model, "conv.ini", MPI_COMM_WORLD) /= MPIGRAD_SUCCESS) &
!     print *, mpigrad_last_error()
!   istat = mpigrad_train_step(model, u, du, loss)   ! loss: this rank's
!   istat = mpigrad_mean_loss(model, loss)            ! over the ranks; collective
!
! Arrays are passed as assumed-rank, assumed-type arguments (type(*), dimension(..)), so one
! interface takes arrays of every rank and of kind real(4), real(8), integer(4) or integer(8),
! contiguous or not, with no copy in this module. Fortran arrays are column-major: the batch is
! the LAST dimension, and a sample's shape is the other dimensions reversed. u(32, 32, 1, 16)
! above is 16 samples of shape [1, 32, 32] (channel, y, x), which fits [model] input_shape =
! 1,32,32; an MLP's input u(1024, 16) is 16 samples of 1024 values.
!
! A sample's shape must be the model's, rank and every extent: u(1024, 16) does not fit
! input_shape = 1,32,32 (only an mlp whose input_shape, or outputs, is one number flattens
! samples of any shape with that many values). Errors give the shapes in Fortran order.
!
! The communicator is an integer (`use mpi`) or a type(MPI_Comm) (`use mpi_f08`): this module
! uses no MPI module (it declares MPI_Comm as mpi_f08 does, a bind(c) type holding MPI_VAL, which
! Fortran takes as the same type), so a host links whichever MPI binding it uses. mpigrad
! duplicates the communicator, and never initializes or finalizes MPI. Every function returns an
! integer status, MPIGRAD_SUCCESS (0) or one of the MPIGRAD_ERROR_* codes; mpigrad_last_error()
! gives the message, mpigrad_status_name(status) the code's name. Integer arguments take the
! default kind or integer(c_int64_t), through generic interfaces: mpigrad_set_seed(42) works.
!
! The calls are those of mpigrad/mpigrad_c.h, whose comments hold the full contract. In short:
! `config` is INI text when it holds a '=' or a line break (new_line('a')), else a file's path;
! [model] input_shape and outputs and [loss] name are required (no [loss]: an error at create
! time); an ONNX graph ([model] name = onnx, file = model.onnx) brings its own shapes, and its
! several inputs or outputs go in mpigrad_array_list lists to mpigrad_train_step_multi. mlp and conv models put ReLU between their layers, none after the last. The loss a step
! returns is this rank's; mpigrad_mean_loss averages it over the model's ranks (collective).
! Creating, training, saving, loading, mpigrad_mean_loss and destroying a distributed model are
! collective (every rank, same order; destroy before MPI_Finalize); creation broadcasts rank
! 0's initial weights. mpigrad_copied_bytes counts the float32 bytes made from arrays that were
! not dense float32. Ranks in messages are numbered within the communicator the model was given.
!
! Interatomic potentials ([loss] name = energy_force) take atomic structures instead:
! mpigrad_atoms_predict(model, x, z, energy, forces, cell=, pbc=, num_atoms=, edge_index=,
! edge_shifts=) and mpigrad_atoms_train_step(model, x, z, energy, forces, loss, ...), with
! positions x(3, n) and the host's neighbor list as edge_index(edges, 2) of 1-based atom numbers.
! Their messages give shapes in C order (x(3, n) is [n, 3]) and atoms and edges numbered from 0.
module mpigrad
  use, intrinsic :: iso_c_binding
  implicit none
  private

  ! mpi_f08's communicator type: any type(MPI_Comm) of the host's `use mpi_f08` is this type.
  type, bind(c) :: MPI_Comm
    integer(c_int) :: MPI_VAL
  end type MPI_Comm

  type, bind(c), public :: mpigrad_model
    integer(c_int64_t) :: id = 0_c_int64_t
  end type mpigrad_model

  ! A list of arrays for the calls of models with several inputs or outputs (an ONNX graph):
  ! TorchFort's tensor list. Each mpigrad_array_list_add describes an array where it lies, so it
  ! must stay allocated until the call that uses the list; destroy the list when done.
  type, bind(c), public :: mpigrad_array_list
    type(c_ptr) :: handle = c_null_ptr
  end type mpigrad_array_list

  integer(c_int), parameter, public :: MPIGRAD_SUCCESS = 0
  integer(c_int), parameter, public :: MPIGRAD_ERROR_NULL_POINTER = 1
  integer(c_int), parameter, public :: MPIGRAD_ERROR_INVALID_HANDLE = 2
  integer(c_int), parameter, public :: MPIGRAD_ERROR_INVALID_ARGUMENT = 3
  integer(c_int), parameter, public :: MPIGRAD_ERROR_SHAPE = 4
  integer(c_int), parameter, public :: MPIGRAD_ERROR_DTYPE = 5
  integer(c_int), parameter, public :: MPIGRAD_ERROR_CONFIG = 6
  integer(c_int), parameter, public :: MPIGRAD_ERROR_FILE = 7
  integer(c_int), parameter, public :: MPIGRAD_ERROR_MPI = 8
  integer(c_int), parameter, public :: MPIGRAD_ERROR_UNSUPPORTED = 9
  integer(c_int), parameter, public :: MPIGRAD_ERROR_OUT_OF_MEMORY = 10
  integer(c_int), parameter, public :: MPIGRAD_ERROR_RUNTIME = 11

  public :: mpigrad_model_create, mpigrad_model_create_distributed, mpigrad_model_destroy
  public :: mpigrad_train_step, mpigrad_predict, mpigrad_last_loss, mpigrad_steps
  public :: mpigrad_save_model, mpigrad_load_model, mpigrad_save_checkpoint
  public :: mpigrad_load_checkpoint, mpigrad_set_seed, mpigrad_version, mpigrad_last_error
  public :: mpigrad_copied_bytes, mpigrad_status_name, mpigrad_mean_loss
  public :: mpigrad_set_step_callback, mpigrad_train_step_on_stream, mpigrad_predict_on_stream
  public :: mpigrad_array_list_create, mpigrad_array_list_add, mpigrad_array_list_destroy
  public :: mpigrad_train_step_multi, mpigrad_predict_multi
  public :: mpigrad_atoms_predict, mpigrad_atoms_train_step

  ! The communicator as `use mpi`'s integer or as `use mpi_f08`'s type(MPI_Comm).
  interface mpigrad_model_create_distributed
    module procedure create_distributed_integer, create_distributed_mpi_comm
  end interface mpigrad_model_create_distributed

  ! Integers of the default kind, or integer(c_int64_t).
  interface mpigrad_set_seed
    module procedure set_seed_default
    ! Seeds the models this thread creates from now on, instead of their config's [train] seed.
    function mpigrad_set_seed_int64(seed) result(status) bind(c, name="mpigrad_set_seed")
      import :: c_int, c_int64_t
      integer(c_int64_t), value :: seed
      integer(c_int) :: status
    end function mpigrad_set_seed_int64
  end interface mpigrad_set_seed

  ! Optimizer steps taken (restored by mpigrad_load_checkpoint).
  interface mpigrad_steps
    module procedure steps_default
    function mpigrad_steps_int64(model, steps) result(status) bind(c, name="mpigrad_steps")
      import :: mpigrad_model, c_int, c_int64_t
      type(mpigrad_model), value :: model
      integer(c_int64_t), intent(out) :: steps
      integer(c_int) :: status
    end function mpigrad_steps_int64
  end interface mpigrad_steps

  ! Bytes of float32 data mpigrad had to make from inputs and labels that were not dense
  ! float32 in the model's memory (real(8) arrays, non-contiguous sections).
  interface mpigrad_copied_bytes
    module procedure copied_bytes_default
    function mpigrad_copied_bytes_int64(model, bytes) result(status) &
        bind(c, name="mpigrad_copied_bytes")
      import :: mpigrad_model, c_int, c_int64_t
      type(mpigrad_model), value :: model
      integer(c_int64_t), intent(out) :: bytes
      integer(c_int) :: status
    end function mpigrad_copied_bytes_int64
  end interface mpigrad_copied_bytes

  interface
    function mpigrad_array_list_create(list) result(status) &
        bind(c, name="mpigrad_fortran_array_list_create")
      import :: mpigrad_array_list, c_int
      type(mpigrad_array_list), intent(inout) :: list
      integer(c_int) :: status
    end function mpigrad_array_list_create

    ! Appends `array` (any rank; real(4), real(8), integer(4) or integer(8)) to the list.
    function mpigrad_array_list_add(list, array) result(status) &
        bind(c, name="mpigrad_fortran_array_list_add")
      import :: mpigrad_array_list, c_int
      type(mpigrad_array_list), value :: list
      type(*), dimension(..), intent(in) :: array
      integer(c_int) :: status
    end function mpigrad_array_list_add

    ! Interatomic potentials ([loss] name = energy_force; see "Interatomic potentials" in
    ! mpigrad/mpigrad_c.h). One structure: positions(3, atoms) real(8) or real(4),
    ! atomic_numbers(atoms) integer(4) or (8), energy a real scalar (or energy(1)), forces(3,
    ! atoms). Several: num_atoms(structures), energy(structures), atoms of all structures
    ! concatenated. Optional, by keyword: cell(3, 3) (cell(:, i) the i-th lattice vector;
    ! cell(3, 3, structures)), pbc(3) integer, nonzero periodic (pbc(3, structures)), the host's
    ! neighbor list edge_index(edges, 2) of Fortran atom numbers (from 1; column 1 the sources,
    ! column 2 the targets, both directions listed; the C API's [2, edges]) and edge_shifts(3,
    ! edges), the Cartesian image offsets
    ! (the edge's vector is x(target) - x(source) + shift); without edge_index, mpigrad builds
    ! the neighbor list with [graph] cutoff. Energies and forces (-dE/dx) are written into
    ! energy and forces (left out: energy only). Local.
    function mpigrad_atoms_predict(model, positions, atomic_numbers, energy, forces, cell, pbc, &
                                   num_atoms, edge_index, edge_shifts) result(status) &
        bind(c, name="mpigrad_fortran_atoms_predict")
      import :: mpigrad_model, c_int
      type(mpigrad_model), value :: model
      type(*), dimension(..), intent(in) :: positions, atomic_numbers
      type(*), dimension(..), intent(inout) :: energy
      type(*), dimension(..), intent(inout), optional :: forces
      type(*), dimension(..), intent(in), optional :: cell, pbc, num_atoms, edge_index, &
                                                      edge_shifts
      integer(c_int) :: status
    end function mpigrad_atoms_predict

    ! One training step on this rank's labelled structures (the reference energy and forces,
    ! the arrays as mpigrad_atoms_predict's): the step of mpigrad train's [loss] energy_force,
    ! with DDP's average over the ranks; collective. `loss` (optional) gets this rank's part of
    ! the loss of all ranks' structures; mpigrad_mean_loss gives the whole.
    function mpigrad_atoms_train_step(model, positions, atomic_numbers, energy, forces, loss, &
                                      cell, pbc, num_atoms, edge_index, edge_shifts) &
        result(status) bind(c, name="mpigrad_fortran_atoms_train_step")
      import :: mpigrad_model, c_int, c_double
      type(mpigrad_model), value :: model
      type(*), dimension(..), intent(in) :: positions, atomic_numbers, energy
      type(*), dimension(..), intent(in), optional :: forces
      real(c_double), intent(out), optional :: loss
      type(*), dimension(..), intent(in), optional :: cell, pbc, num_atoms, edge_index, &
                                                      edge_shifts
      integer(c_int) :: status
    end function mpigrad_atoms_train_step

    function mpigrad_array_list_destroy(list) result(status) &
        bind(c, name="mpigrad_fortran_array_list_destroy")
      import :: mpigrad_array_list, c_int
      type(mpigrad_array_list), intent(inout) :: list
      integer(c_int) :: status
    end function mpigrad_array_list_destroy

    ! mpigrad_train_step_multi of mpigrad_c.h: one array per graph input in `inputs`, one label
    ! array per graph output in `labels`; the loss is the sum over the outputs.
    function mpigrad_train_step_multi(model, inputs, labels, loss) result(status) &
        bind(c, name="mpigrad_fortran_train_step_multi")
      import :: mpigrad_model, mpigrad_array_list, c_int, c_double
      type(mpigrad_model), value :: model
      type(mpigrad_array_list), value :: inputs, labels
      real(c_double), intent(out), optional :: loss
      integer(c_int) :: status
    end function mpigrad_train_step_multi

    ! The outputs for `inputs` in evaluation mode, one array of `outputs` per graph output.
    function mpigrad_predict_multi(model, inputs, outputs) result(status) &
        bind(c, name="mpigrad_fortran_predict_multi")
      import :: mpigrad_model, mpigrad_array_list, c_int
      type(mpigrad_model), value :: model
      type(mpigrad_array_list), value :: inputs, outputs
      integer(c_int) :: status
    end function mpigrad_predict_multi

    ! One optimizer step on this rank's batch; `loss` may be left out (the step then does not
    ! wait for it; mpigrad_last_loss reads it later).
    function mpigrad_train_step(model, input, label, loss) result(status) &
        bind(c, name="mpigrad_fortran_train_step")
      import :: mpigrad_model, c_int, c_double
      type(mpigrad_model), value :: model
      type(*), dimension(..), intent(in) :: input, label
      real(c_double), intent(out), optional :: loss
      integer(c_int) :: status
    end function mpigrad_train_step

    ! The model's output for `input` in evaluation mode, written into `output` (the same batch,
    ! as many values per sample as the model outputs).
    function mpigrad_predict(model, input, output) result(status) &
        bind(c, name="mpigrad_fortran_predict")
      import :: mpigrad_model, c_int
      type(mpigrad_model), value :: model
      type(*), dimension(..), intent(in) :: input
      type(*), dimension(..), intent(inout) :: output
      integer(c_int) :: status
    end function mpigrad_predict

    ! mpigrad_train_step and mpigrad_predict queued on a CUDA stream (type(c_ptr), a
    ! cudaStream_t) of a model on a GPU: see mpigrad_train_step_on_stream in mpigrad_c.h.
    function mpigrad_train_step_on_stream(model, input, label, stream, loss) result(status) &
        bind(c, name="mpigrad_fortran_train_step_on_stream")
      import :: mpigrad_model, c_int, c_double, c_ptr
      type(mpigrad_model), value :: model
      type(*), dimension(..), intent(in) :: input, label
      type(c_ptr), value :: stream
      real(c_double), intent(out), optional :: loss
      integer(c_int) :: status
    end function mpigrad_train_step_on_stream

    function mpigrad_predict_on_stream(model, input, output, stream) result(status) &
        bind(c, name="mpigrad_fortran_predict_on_stream")
      import :: mpigrad_model, c_int, c_ptr
      type(mpigrad_model), value :: model
      type(*), dimension(..), intent(in) :: input
      type(*), dimension(..), intent(inout) :: output
      type(c_ptr), value :: stream
      integer(c_int) :: status
    end function mpigrad_predict_on_stream

    function mpigrad_last_loss(model, loss) result(status) bind(c, name="mpigrad_last_loss")
      import :: mpigrad_model, c_int, c_double
      type(mpigrad_model), value :: model
      real(c_double), intent(out) :: loss
      integer(c_int) :: status
    end function mpigrad_last_loss

    ! The last step's loss over the model's ranks, each rank's weighted by its batch (the loss
    ! of the global batch); collective, one all-reduce only when called.
    function mpigrad_mean_loss(model, loss) result(status) bind(c, name="mpigrad_mean_loss")
      import :: mpigrad_model, c_int, c_double
      type(mpigrad_model), value :: model
      real(c_double), intent(out) :: loss
      integer(c_int) :: status
    end function mpigrad_mean_loss

    ! Calls `callback` (c_funloc of a bind(c) subroutine with the arguments
    ! (type(mpigrad_model), value; integer(c_int64_t), value :: step; real(c_double), value ::
    ! lr; type(c_ptr), value :: user_data)) on every rank after each optimizer step;
    ! c_null_funptr removes it.
    function mpigrad_set_step_callback(model, callback, user_data) result(status) &
        bind(c, name="mpigrad_set_step_callback")
      import :: mpigrad_model, c_int, c_funptr, c_ptr
      type(mpigrad_model), value :: model
      type(c_funptr), value :: callback
      type(c_ptr), value :: user_data
      integer(c_int) :: status
    end function mpigrad_set_step_callback

    function mpigrad_model_destroy(model) result(status) bind(c, name="mpigrad_model_destroy")
      import :: mpigrad_model, c_int
      type(mpigrad_model), intent(inout) :: model
      integer(c_int) :: status
    end function mpigrad_model_destroy
  end interface

  ! The C functions the module procedures below call with null-terminated strings.
  interface
    function c_model_create(model, config, device) result(status) &
        bind(c, name="mpigrad_model_create")
      import :: mpigrad_model, c_int, c_char
      type(mpigrad_model), intent(out) :: model
      character(kind=c_char), dimension(*), intent(in) :: config, device
      integer(c_int) :: status
    end function c_model_create

    function c_model_create_distributed(model, config, comm, device) result(status) &
        bind(c, name="mpigrad_model_create_distributed")
      import :: mpigrad_model, c_int, c_int32_t, c_char
      type(mpigrad_model), intent(out) :: model
      character(kind=c_char), dimension(*), intent(in) :: config, device
      integer(c_int32_t), value :: comm
      integer(c_int) :: status
    end function c_model_create_distributed

    function c_save_model(model, path) result(status) bind(c, name="mpigrad_save_model")
      import :: mpigrad_model, c_int, c_char
      type(mpigrad_model), value :: model
      character(kind=c_char), dimension(*), intent(in) :: path
      integer(c_int) :: status
    end function c_save_model

    function c_load_model(model, path) result(status) bind(c, name="mpigrad_load_model")
      import :: mpigrad_model, c_int, c_char
      type(mpigrad_model), value :: model
      character(kind=c_char), dimension(*), intent(in) :: path
      integer(c_int) :: status
    end function c_load_model

    function c_save_checkpoint(model, path) result(status) &
        bind(c, name="mpigrad_save_checkpoint")
      import :: mpigrad_model, c_int, c_char
      type(mpigrad_model), value :: model
      character(kind=c_char), dimension(*), intent(in) :: path
      integer(c_int) :: status
    end function c_save_checkpoint

    function c_load_checkpoint(model, path) result(status) &
        bind(c, name="mpigrad_load_checkpoint")
      import :: mpigrad_model, c_int, c_char
      type(mpigrad_model), value :: model
      character(kind=c_char), dimension(*), intent(in) :: path
      integer(c_int) :: status
    end function c_load_checkpoint

    function c_version() result(text) bind(c, name="mpigrad_version")
      import :: c_ptr
      type(c_ptr) :: text
    end function c_version

    function c_last_error() result(text) bind(c, name="mpigrad_last_error")
      import :: c_ptr
      type(c_ptr) :: text
    end function c_last_error

    function c_status_name(status) result(text) bind(c, name="mpigrad_status_name")
      import :: c_ptr, c_int
      integer(c_int), value :: status
      type(c_ptr) :: text
    end function c_status_name

    function c_strlen(text) result(length) bind(c, name="strlen")
      import :: c_ptr, c_size_t
      type(c_ptr), value :: text
      integer(c_size_t) :: length
    end function c_strlen
  end interface

contains

  ! `text` as a null-terminated C string (trailing blanks dropped).
  pure function c_string(text) result(out)
    character(len=*), intent(in) :: text
    character(kind=c_char, len=len_trim(text) + 1) :: out
    out = trim(text) // c_null_char
  end function c_string

  ! A C string as a Fortran string.
  function f_string(text) result(out)
    type(c_ptr), intent(in) :: text
    character(len=:), allocatable :: out
    character(kind=c_char), pointer :: chars(:)
    integer :: i, n
    n = int(c_strlen(text))
    call c_f_pointer(text, chars, [n])
    allocate(character(len=n) :: out)
    do i = 1, n
      out(i:i) = chars(i)
    end do
  end function f_string

  ! `config`: INI text or the path of an INI file; `device`: "cpu" (default), "cuda", "cuda:N".
  function mpigrad_model_create(model, config, device) result(status)
    type(mpigrad_model), intent(out) :: model
    character(len=*), intent(in) :: config
    character(len=*), intent(in), optional :: device
    integer(c_int) :: status
    if (present(device)) then
      status = c_model_create(model, c_string(config), c_string(device))
    else
      status = c_model_create(model, c_string(config), c_string("cpu"))
    end if
  end function mpigrad_model_create

  ! Data-parallel over a duplicate of `comm`; `device` left out picks this rank's.
  function create_distributed_integer(model, config, comm, device) result(status)
    type(mpigrad_model), intent(out) :: model
    character(len=*), intent(in) :: config
    integer, intent(in) :: comm
    character(len=*), intent(in), optional :: device
    integer(c_int) :: status
    if (present(device)) then
      status = c_model_create_distributed(model, c_string(config), int(comm, c_int32_t), &
                                          c_string(device))
    else
      status = c_model_create_distributed(model, c_string(config), int(comm, c_int32_t), &
                                          c_string(""))
    end if
  end function create_distributed_integer

  function create_distributed_mpi_comm(model, config, comm, device) result(status)
    type(mpigrad_model), intent(out) :: model
    character(len=*), intent(in) :: config
    type(MPI_Comm), intent(in) :: comm
    character(len=*), intent(in), optional :: device
    integer(c_int) :: status
    status = create_distributed_integer(model, config, comm%MPI_VAL, device)
  end function create_distributed_mpi_comm

  function mpigrad_save_model(model, path) result(status)
    type(mpigrad_model), intent(in) :: model
    character(len=*), intent(in) :: path
    integer(c_int) :: status
    status = c_save_model(model, c_string(path))
  end function mpigrad_save_model

  function mpigrad_load_model(model, path) result(status)
    type(mpigrad_model), intent(in) :: model
    character(len=*), intent(in) :: path
    integer(c_int) :: status
    status = c_load_model(model, c_string(path))
  end function mpigrad_load_model

  function mpigrad_save_checkpoint(model, path) result(status)
    type(mpigrad_model), intent(in) :: model
    character(len=*), intent(in) :: path
    integer(c_int) :: status
    status = c_save_checkpoint(model, c_string(path))
  end function mpigrad_save_checkpoint

  function mpigrad_load_checkpoint(model, path) result(status)
    type(mpigrad_model), intent(in) :: model
    character(len=*), intent(in) :: path
    integer(c_int) :: status
    status = c_load_checkpoint(model, c_string(path))
  end function mpigrad_load_checkpoint

  function mpigrad_version() result(text)
    character(len=:), allocatable :: text
    text = f_string(c_version())
  end function mpigrad_version

  ! The message of this thread's last failed call.
  function mpigrad_last_error() result(text)
    character(len=:), allocatable :: text
    text = f_string(c_last_error())
  end function mpigrad_last_error

  ! "MPIGRAD_ERROR_SHAPE", ...
  function mpigrad_status_name(status) result(text)
    integer(c_int), intent(in) :: status
    character(len=:), allocatable :: text
    text = f_string(c_status_name(status))
  end function mpigrad_status_name

  function set_seed_default(seed) result(status)
    integer, intent(in) :: seed
    integer(c_int) :: status
    status = mpigrad_set_seed_int64(int(seed, c_int64_t))
  end function set_seed_default

  function steps_default(model, steps) result(status)
    type(mpigrad_model), intent(in) :: model
    integer, intent(out) :: steps
    integer(c_int) :: status
    integer(c_int64_t) :: wide
    status = mpigrad_steps_int64(model, wide)
    steps = int(wide)
  end function steps_default

  function copied_bytes_default(model, bytes) result(status)
    type(mpigrad_model), intent(in) :: model
    integer, intent(out) :: bytes
    integer(c_int) :: status
    integer(c_int64_t) :: wide
    status = mpigrad_copied_bytes_int64(model, wide)
    bytes = int(wide)
  end function copied_bytes_default

end module mpigrad
