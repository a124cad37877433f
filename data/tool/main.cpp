// mpigrad-data: the data tool as a standalone program (see data/data_tool.h).
#include "mpigrad/data/data_tool.h"

int main(int argc, char** argv) {
  return mpigrad::data::run_data_command(argc, argv);
}
