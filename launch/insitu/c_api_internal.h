/* For mpigrad's own bindings over the C API (the Fortran shim): records an error the way every
 * C API call does, so mpigrad_last_error() reports it. Not installed. */
#ifndef MPIGRAD_C_API_INTERNAL_H
#define MPIGRAD_C_API_INTERNAL_H

#include "mpigrad/mpigrad_c.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Sets this thread's last error to "<function>: <message>" and returns `status`. */
mpigrad_status mpigrad_record_error(const char* function, mpigrad_status status,
                                    const char* message);

#ifdef __cplusplus
}
#endif

#endif
