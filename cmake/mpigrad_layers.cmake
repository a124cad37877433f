# Reads layers.txt, the one list of mpigrad's layers (lowest first; the file says how to read it),
# for the CMake files that follow its order. Editing layers.txt re-runs CMake.
#
# mpigrad_read_layers(<out-var>): its entries in order ("kernels;core;...;launch/commands"),
# without comments and "beside" marks.
# mpigrad_launch_layers(<out-var>): the launch/ entries, relative to launch/ ("comm;job;...").
function(mpigrad_read_layers out)
  set(file ${PROJECT_SOURCE_DIR}/layers.txt)
  set_property(DIRECTORY ${PROJECT_SOURCE_DIR} APPEND PROPERTY CMAKE_CONFIGURE_DEPENDS ${file})
  file(STRINGS ${file} lines)
  set(entries "")
  foreach(line IN LISTS lines)
    string(REGEX REPLACE "#.*" "" line "${line}")
    string(STRIP "${line}" line)
    if(line STREQUAL "")
      continue()
    endif()
    string(REGEX REPLACE "^beside[ \t]+" "" entry "${line}")
    # One word a line: a semicolon in a comment would split the line into list items.
    if(NOT entry MATCHES "^[A-Za-z0-9_./-]+$")
      message(FATAL_ERROR "mpigrad: ${file}: '${line}' is not one folder (and a # comment)")
    endif()
    list(APPEND entries ${entry})
  endforeach()
  set(${out} ${entries} PARENT_SCOPE)
endfunction()

function(mpigrad_launch_layers out)
  mpigrad_read_layers(entries)
  list(FILTER entries INCLUDE REGEX "^launch/")
  list(TRANSFORM entries REPLACE "^launch/" "")
  set(${out} ${entries} PARENT_SCOPE)
endfunction()
