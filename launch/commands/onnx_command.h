// `mpigrad onnx inspect MODEL.onnx` and `mpigrad onnx export --checkpoint C.h5 --model M.onnx -o
// OUT.onnx`: what a user needs around training an ONNX graph (issue 23).
//   inspect  prints the graph's inputs and outputs (names, dtypes, shapes, ? for a free
//            dimension), its initializers as mpigrad will hold them (parameters, BatchNorm
//            buffers, integer constants) with their shapes, and every op type with its count and
//            whether nn::OnnxModel runs it at the file's opset. Exit 0 when every op is
//            supported, 3 when some are not (the list says which), 1 on a bad file.
//   export   writes the checkpoint's /model tensors back into a copy of the graph, by name, so
//            ONNX Runtime or PyTorch get the trained weights. Every initializer that training
//            changes must be in the checkpoint with its shape, and every checkpoint tensor must
//            have its initializer (num_batches_tracked, which ONNX has no use for, excepted).
//            The output is self-contained (weights inline, whatever the input's external data),
//            written through a temporary file and a rename; protobuf's 2 GiB limit on one
//            message is checked first. It is an inference graph: BatchNormalization and Dropout
//            that the legacy exporter wrote in training mode are switched to inference mode, so
//            ONNX Runtime uses the trained running statistics and no dropout.
// One process, no MPI: neither command trains.
#pragma once

namespace mpigrad::launch {

// argv[0] is "onnx"; returns the process exit code.
int run_onnx_command(int argc, char** argv);

}  // namespace mpigrad::launch
