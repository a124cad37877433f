# The installed headers: the public entry points and every mpigrad header they include,
# followed transitively. Anything else (op support, CPU kernel helpers, communicator internals)
# stays in the source tree, so the installed API is exactly what the public headers reach.
#
# mpigrad_public_headers(<out-var> <entry>...): entries and results are paths relative to the
# source root ("mpigrad.h", "launch/mpi_interop.h").
function(mpigrad_public_headers out)
  set(pending ${ARGN})
  set(found "")
  while(pending)
    list(POP_FRONT pending header)
    if(header IN_LIST found)
      continue()
    endif()
    if(NOT EXISTS ${CMAKE_SOURCE_DIR}/${header})
      message(FATAL_ERROR "mpigrad: public header ${header} is included but does not exist")
    endif()
    list(APPEND found ${header})
    # Re-run CMake when a public header's includes change.
    set_property(DIRECTORY ${CMAKE_SOURCE_DIR} APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS
                 ${CMAKE_SOURCE_DIR}/${header})
    file(STRINGS ${CMAKE_SOURCE_DIR}/${header} includes REGEX "^#include \"mpigrad/")
    foreach(line ${includes})
      string(REGEX REPLACE "^#include \"mpigrad/([^\"]+)\".*" "\\1" included "${line}")
      if(NOT included STREQUAL "version.h")  # generated, installed on its own
        list(APPEND pending ${included})
      endif()
    endforeach()
  endwhile()
  list(SORT found)
  set(${out} ${found} PARENT_SCOPE)
endfunction()
