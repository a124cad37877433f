// The ONNX backend conformance run: every case of ONNX's own test suite (Debian's
// libonnx-testdata: node tests, PyTorch-converted modules, PyTorch operator tests) whose ops
// OnnxModel supports is loaded, run in eval mode on each of its data sets, and compared with the
// expected outputs at ONNX's tolerances (|got - want| <= 1e-7 + 1e-3 |want|).
//
// Usage: mpigrad-onnx-conformance DATA_DIR EXCEPTIONS_FILE [CASE_SUBSTRING]
// Prints how many cases ran, passed, failed and were skipped (with the reasons, grouped), and
// exits 1 if a case failed that the exceptions file (lines "case_name  reason") does not name.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "mpigrad/core/error.h"
#include "mpigrad/nn/onnx/onnx_file.h"
#include "mpigrad/nn/onnx/onnx_model.h"

namespace fs = std::filesystem;
using namespace mpigrad;

namespace {

onnx::TensorProto read_tensor(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  std::stringstream bytes;
  bytes << in.rdbuf();
  onnx::TensorProto proto;
  MPIGRAD_CHECK(proto.ParseFromString(bytes.str()), file.string(), ": not a TensorProto");
  return proto;
}

// "" when they agree, else the first difference.
std::string compare(const core::Tensor& got, const core::Tensor& want) {
  if (!(got.shape() == want.shape())) {
    std::ostringstream out;
    out << "shape " << got.shape() << ", expected " << want.shape();
    return out.str();
  }
  const std::vector<double> a =
      got.detach().to(core::kCPU, core::kFloat64).contiguous().to_vector<double>();
  const std::vector<double> b = want.to(core::kFloat64).contiguous().to_vector<double>();
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) && std::isnan(b[i])) continue;
    if (a[i] == b[i]) continue;
    if (!(std::abs(a[i] - b[i]) <= 1e-7 + 1e-3 * std::abs(b[i]))) {
      std::ostringstream out;
      out << "element " << i << ": " << a[i] << ", expected " << b[i];
      return out.str();
    }
  }
  return "";
}

std::vector<fs::path> sorted_entries(const fs::path& dir, const std::string& prefix) {
  std::vector<fs::path> out;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().filename().string().rfind(prefix, 0) == 0) out.push_back(entry.path());
  std::sort(out.begin(), out.end(), [](const fs::path& a, const fs::path& b) {
    // input_10 after input_9
    const auto na = a.filename().string(), nb = b.filename().string();
    return na.size() != nb.size() ? na.size() < nb.size() : na < nb;
  });
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: %s DATA_DIR EXCEPTIONS_FILE [CASE_SUBSTRING]\n", argv[0]);
    return 2;
  }
  const fs::path data = argv[1];
  const std::string filter = argc > 3 ? argv[3] : "";
  std::map<std::string, std::string> exceptions;
  {
    std::ifstream in(argv[2]);
    std::string line;
    while (std::getline(in, line)) {
      if (line.empty() || line[0] == '#') continue;
      std::istringstream words(line);
      std::string name, reason;
      words >> name;
      std::getline(words, reason);
      exceptions[name] = reason;
    }
  }
  int ran = 0, passed = 0, known = 0;
  std::vector<std::string> failures;
  std::map<std::string, std::vector<std::string>> skipped;  // reason -> cases
  std::set<std::string> seen;
  for (const char* suite : {"node", "pytorch-converted", "pytorch-operator"}) {
    if (!fs::exists(data / suite)) {
      std::fprintf(stderr, "conformance: %s has no %s folder\n", data.c_str(), suite);
      return 2;
    }
    for (const fs::path& dir : sorted_entries(data / suite, "test_")) {
      const std::string name = dir.filename().string();
      if (!filter.empty() && name.find(filter) == std::string::npos) continue;
      seen.insert(name);
      onnx::ModelProto proto;
      try {
        proto = nn::read_onnx_model(dir / "model.onnx");
      } catch (const core::Error& error) {
        const std::string what = error.what();
        skipped[what.find("opset") != std::string::npos        ? "opset outside 7..20"
                : what.find("IR version") != std::string::npos ? "IR version"
                                                               : "does not load"]
            .push_back(name);
        continue;
      }
      const int64_t opset = nn::onnx_default_opset(proto);
      std::set<std::string> missing;
      for (const auto& node : proto.graph().node())
        if (!nn::onnx_op_supported(node.op_type(), opset) ||
            !(node.domain().empty() || node.domain() == "ai.onnx"))
          missing.insert(node.op_type());
      if (!missing.empty()) {
        std::string ops;
        for (const auto& op : missing) ops += (ops.empty() ? "" : ",") + op;
        skipped["op not supported: " + ops].push_back(name);
        continue;
      }
      bool tensors_only = true;
      for (const auto& list : {proto.graph().input(), proto.graph().output()})
        for (const auto& value : list)
          if (!value.type().has_tensor_type()) tensors_only = false;
      if (!tensors_only) {
        skipped["sequence or optional values"].push_back(name);
        continue;
      }
      ++ran;
      std::string failure;
      try {
        auto model = nn::OnnxModel::load((dir / "model.onnx").string());
        model->eval();
        for (const fs::path& set : sorted_entries(dir, "test_data_set_")) {
          std::vector<core::Tensor> inputs, expected;
          for (const fs::path& file : sorted_entries(set, "input_"))
            inputs.push_back(nn::tensor_from_proto(read_tensor(file), file.string()));
          for (const fs::path& file : sorted_entries(set, "output_"))
            expected.push_back(nn::tensor_from_proto(read_tensor(file), file.string()));
          const std::vector<core::Tensor> got = model->forward_all(inputs);
          for (size_t i = 0; i < expected.size() && failure.empty(); ++i) {
            if (i >= got.size()) {
              failure = "output " + std::to_string(i) + " missing";
              break;
            }
            const std::string difference = compare(got[i], expected[i]);
            if (!difference.empty())
              failure =
                  set.filename().string() + " output " + std::to_string(i) + ": " + difference;
          }
          if (!failure.empty()) break;
        }
      } catch (const std::exception& error) {
        failure = error.what();
        if (failure.find("ONNX data type") != std::string::npos) {
          --ran;
          skipped["data type not supported"].push_back(name);
          continue;
        }
      }
      if (failure.empty()) {
        ++passed;
        if (exceptions.count(name))
          std::printf("PASSES BUT LISTED AS EXCEPTION: %s\n", name.c_str());
      } else if (exceptions.count(name)) {
        ++known;
      } else {
        failures.push_back(name + ": " + failure);
      }
    }
  }
  std::printf(
      "ONNX conformance: %d cases ran, %d passed, %d failed as listed in the exceptions "
      "file, %zu failed unexpectedly\n",
      ran, passed, known, failures.size());
  int skipped_total = 0;
  for (const auto& [reason, cases] : skipped) skipped_total += int(cases.size());
  std::printf("skipped %d cases:\n", skipped_total);
  for (const auto& [reason, cases] : skipped) {
    std::printf("  %3zu  %s (", cases.size(), reason.c_str());
    for (size_t i = 0; i < cases.size() && i < 3; ++i)
      std::printf("%s%s", i ? ", " : "", cases[i].c_str());
    std::printf("%s)\n", cases.size() > 3 ? ", ..." : "");
  }
  for (const auto& [name, reason] : exceptions)
    if (filter.empty() && !seen.count(name))
      std::printf("exception for a case that does not exist: %s\n", name.c_str());
  for (const auto& failure : failures) std::printf("FAILED %s\n", failure.c_str());
  return failures.empty() ? 0 : 1;
}
