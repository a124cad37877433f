! The Fortran module `mpigrad`: in-situ training from Fortran simulation codes, over the C API
! (mpigrad/mpigrad_c.h), with gfortran.
!
!   use mpigrad
!   type(mpigrad_model) :: model
!   real(c_float) :: u(32, 32, 1, 16), du(32, 32, 1, 16)   ! (x, y, channel, sample)
!   real(c_double) :: loss
!   if (mpigrad_model_create_distributed(model, "mlp.ini", MPI_COMM_WORLD) /= MPIGRAD_SUCCESS) &
!     print *, mpigrad_last_error()
!   istat = mpigrad_train_step(model, u, du, loss)
!
! Arrays are passed as assumed-rank, assumed-type arguments (type(*), dimension(..)), so one
! interface takes arrays of every rank and of kind real(4), real(8), integer(4) or integer(8),
! contiguous or not, with no copy in this module. Fortran arrays are column-major: the batch is
! the LAST dimension, and a sample's shape is the other dimensions reversed. u(32, 32, 1, 16)
! above is 16 samples of shape [1, 32, 32] (channel, y, x), which fits [model] input_shape =
! 1,32,32; an MLP's input u(1024, 16) is 16 samples of 1024 values.
!
! The communicator is an integer (`use mpi`) or a type(MPI_Comm) (`use mpi_f08`); mpigrad
! duplicates it, and never initializes or finalizes MPI. Every function returns an integer
! status, MPIGRAD_SUCCESS (0) or one of the MPIGRAD_ERROR_* codes; mpigrad_last_error() gives
! the message.
module mpigrad
  use, intrinsic :: iso_c_binding
  use mpi_f08, only: MPI_Comm
  implicit none
  private

  type, bind(c), public :: mpigrad_model
    integer(c_int64_t) :: id = 0_c_int64_t
  end type mpigrad_model

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

  ! The communicator as `use mpi`'s integer or as `use mpi_f08`'s type(MPI_Comm).
  interface mpigrad_model_create_distributed
    module procedure create_distributed_integer, create_distributed_mpi_comm
  end interface mpigrad_model_create_distributed

  interface
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

    function mpigrad_last_loss(model, loss) result(status) bind(c, name="mpigrad_last_loss")
      import :: mpigrad_model, c_int, c_double
      type(mpigrad_model), value :: model
      real(c_double), intent(out) :: loss
      integer(c_int) :: status
    end function mpigrad_last_loss

    function mpigrad_steps(model, steps) result(status) bind(c, name="mpigrad_steps")
      import :: mpigrad_model, c_int, c_int64_t
      type(mpigrad_model), value :: model
      integer(c_int64_t), intent(out) :: steps
      integer(c_int) :: status
    end function mpigrad_steps

    function mpigrad_set_seed(seed) result(status) bind(c, name="mpigrad_set_seed")
      import :: c_int, c_int64_t
      integer(c_int64_t), value :: seed
      integer(c_int) :: status
    end function mpigrad_set_seed

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

end module mpigrad
