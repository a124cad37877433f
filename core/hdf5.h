// RAII wrappers over the HDF5 C library, shared by the data readers (data/) and the checkpoints
// (nn/); the include that callers use. Every hid_t is owned by exactly one Handle, which closes
// it with the matching H5*close. Every call is checked: a failure throws core::Error naming the
// HDF5 call, the file and the object, followed by the messages HDF5 put on its error stack
// (which is never printed to stderr: automatic printing is turned off for every thread that uses
// these wrappers). No header here includes <hdf5.h>: hid_t travels as int64_t.
//
// The family, one concept a header, under core/hdf5/:
//   handle.h              Handle (owns one identifier), silence_errors, library_version
//   types.h               Datatype: the HDF5 type of each DType, and the DType of a stored type
//   dataspace.h           Dataspace: extents and checked selections of blocks and rows
//   dataset.h             Dataset (what it holds, reading and writing it), DatasetLayout,
//                         DatasetAccess
//   file.h                File: opening and creating, objects, listing and walking groups,
//                         attributes; ObjectKind
//   atomic_file_writer.h  AtomicFileWriter: a new file written under a temporary name, renamed
//                         into place on commit
//   mapped_rows.h         MappedRows: a contiguous dataset's rows as bytes from a memory map
// Their .cpp files share core/hdf5/internal.h (the checked calls, with <hdf5.h>), which callers
// never include.
#pragma once

#include "mpigrad/core/hdf5/atomic_file_writer.h"
#include "mpigrad/core/hdf5/dataset.h"
#include "mpigrad/core/hdf5/dataspace.h"
#include "mpigrad/core/hdf5/file.h"
#include "mpigrad/core/hdf5/handle.h"
#include "mpigrad/core/hdf5/mapped_rows.h"
#include "mpigrad/core/hdf5/types.h"
