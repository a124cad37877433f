#include "mpigrad/data/neighbor_list.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <tuple>

#include "mpigrad/core/backend.h"
#include "mpigrad/core/error.h"
#include "mpigrad/data/batch_buffers.h"
#include "mpigrad/kernels/neighbor_list.h"

namespace mpigrad::data {

namespace {

using Matrix = std::array<double, 9>;  // row-major; rows are lattice vectors

double determinant(const Matrix& m) {
  return m[0] * (m[4] * m[8] - m[5] * m[7]) - m[1] * (m[3] * m[8] - m[5] * m[6]) +
         m[2] * (m[3] * m[7] - m[4] * m[6]);
}

Matrix inverse(const Matrix& m, double det) {
  const double f = 1.0 / det;
  return {(m[4] * m[8] - m[5] * m[7]) * f, (m[2] * m[7] - m[1] * m[8]) * f,
          (m[1] * m[5] - m[2] * m[4]) * f, (m[5] * m[6] - m[3] * m[8]) * f,
          (m[0] * m[8] - m[2] * m[6]) * f, (m[2] * m[3] - m[0] * m[5]) * f,
          (m[3] * m[7] - m[4] * m[6]) * f, (m[1] * m[6] - m[0] * m[7]) * f,
          (m[0] * m[4] - m[1] * m[3]) * f};
}

// The distance between the two faces of the cell spanned by the other two lattice vectors:
// |det| / |a_j x a_k|. A fractional step of 1 along axis i moves this far across those faces.
double height(const Matrix& m, int axis, double volume) {
  const int j = (axis + 1) % 3, k = (axis + 2) % 3;
  const double* a = &m[size_t(3 * j)];
  const double* b = &m[size_t(3 * k)];
  const double cx = a[1] * b[2] - a[2] * b[1], cy = a[2] * b[0] - a[0] * b[2],
               cz = a[0] * b[1] - a[1] * b[0];
  return volume / std::sqrt(cx * cx + cy * cy + cz * cz);
}

int64_t floor_div(int64_t a, int64_t b) {
  const int64_t q = a / b;
  return (a % b != 0 && (a < 0) != (b < 0)) ? q - 1 : q;
}

// The frame the search works in: the cell when some axis is periodic (it must then span space),
// else Cartesian coordinates (a cell without pbc plays no part).
Matrix search_basis(const Matrix& cell, const std::array<bool, 3>& pbc, const std::string& where) {
  if (!(pbc[0] || pbc[1] || pbc[2])) return {1, 0, 0, 0, 1, 0, 0, 0, 1};
  const double det = determinant(cell);
  double longest = 0;
  for (double v : cell) longest = std::max(longest, std::abs(v));
  MPIGRAD_CHECK(
      std::isfinite(det) && std::abs(det) > 1e-12 * longest * longest * longest && longest > 0,
      where, ": pbc is set on an axis but the cell [", cell[0], " ", cell[1], " ", cell[2], "; ",
      cell[3], " ", cell[4], " ", cell[5], "; ", cell[6], " ", cell[7], " ", cell[8],
      "] has no volume; a periodic structure needs three independent "
      "lattice vectors (give a vacuum vector along a non-periodic axis)");
  return cell;
}

// A candidate source of one target.
struct Candidate {
  int64_t source;
  std::array<int64_t, 3> image;
  double distance2;
};

bool edge_order(const Candidate& a, const Candidate& b) {
  return std::tie(a.source, a.image) < std::tie(b.source, b.image);
}

}  // namespace

StructureEdges radius_graph(std::span<const double> positions, const std::array<double, 9>& cell,
                            const std::array<bool, 3>& pbc, const NeighborListOptions& options,
                            const std::string& where) {
  const double cutoff = options.cutoff;
  MPIGRAD_CHECK(std::isfinite(cutoff) && cutoff > 0, where, ": the cutoff must be positive, got ",
                cutoff);
  MPIGRAD_CHECK(options.max_neighbors >= 0, where, ": max_neighbors must be >= 0, got ",
                options.max_neighbors);
  MPIGRAD_CHECK(positions.size() % 3 == 0, where, ": ", positions.size(),
                " coordinates are not whole atoms");
  const int64_t atoms = int64_t(positions.size() / 3);
  for (size_t i = 0; i < positions.size(); ++i) {
    MPIGRAD_CHECK(std::isfinite(positions[i]), where, ": atom ", i / 3, " has position component ",
                  positions[i]);
  }
  StructureEdges edges;
  if (atoms == 0) return edges;

  const bool periodic = pbc[0] || pbc[1] || pbc[2];
  const Matrix basis = search_basis(cell, pbc, where);
  const double det = determinant(basis);
  const double volume = std::abs(det);
  const Matrix inv = inverse(basis, det);

  // Fractional coordinates, wrapped into [0, 1) along periodic axes; `wrap` counts the cells an
  // atom was moved by, so that shifts refer to the positions as given.
  std::vector<double> fractional(size_t(atoms * 3)), wrapped(size_t(atoms * 3));
  std::vector<int64_t> wrap(size_t(atoms * 3), 0);
  for (int64_t a = 0; a < atoms; ++a) {
    const double* r = &positions[size_t(3 * a)];
    for (int k = 0; k < 3; ++k) {
      double s = r[0] * inv[size_t(k)] + r[1] * inv[size_t(3 + k)] + r[2] * inv[size_t(6 + k)];
      if (pbc[size_t(k)]) {
        double w = std::floor(s);
        s -= w;
        if (s >= 1.0) {  // s was a hair below an integer
          s -= 1.0;
          w += 1.0;
        }
        wrap[size_t(3 * a + k)] = int64_t(w);
      }
      fractional[size_t(3 * a + k)] = s;
    }
    for (int c = 0; c < 3; ++c) {
      double moved = r[c];
      for (int k = 0; k < 3; ++k) {
        moved -= double(wrap[size_t(3 * a + k)]) * basis[size_t(3 * k + c)];
      }
      wrapped[size_t(3 * a + c)] = moved;
    }
  }

  // Bins along each axis, each at least the cutoff thick across the faces (so a neighbor is at
  // most `reach` bins away), no more bins in all than about twice the atoms.
  std::array<double, 3> low{}, span{}, thickness{};
  std::array<int64_t, 3> bins{}, reach{};
  for (int k = 0; k < 3; ++k) {
    const double h = height(basis, k, volume);
    if (pbc[size_t(k)]) {
      low[size_t(k)] = 0;
      span[size_t(k)] = 1;
    } else {
      double lo = fractional[size_t(k)], hi = lo;
      for (int64_t a = 1; a < atoms; ++a) {
        lo = std::min(lo, fractional[size_t(3 * a + k)]);
        hi = std::max(hi, fractional[size_t(3 * a + k)]);
      }
      low[size_t(k)] = lo;
      span[size_t(k)] = hi - lo;
    }
    thickness[size_t(k)] = span[size_t(k)] * h;
    bins[size_t(k)] = std::max<int64_t>(1, int64_t(std::min(thickness[size_t(k)] / cutoff, 1e6)));
  }
  const int64_t most_bins = std::max<int64_t>(8, 2 * atoms);
  while (bins[0] * bins[1] * bins[2] > most_bins) {
    const size_t widest = size_t(std::max_element(bins.begin(), bins.end()) - bins.begin());
    bins[widest] = std::max<int64_t>(1, bins[widest] / 2);
  }
  int64_t searched = 1;
  for (int k = 0; k < 3; ++k) {
    if (bins[size_t(k)] == 1 && !pbc[size_t(k)]) {
      reach[size_t(k)] = 0;  // one bin holds every atom along this axis
    } else {
      const double bin_thickness = thickness[size_t(k)] / double(bins[size_t(k)]);
      const double needed = std::ceil(cutoff / bin_thickness);
      MPIGRAD_CHECK(needed <= 1e6, where, ": the cutoff ", cutoff, " is ", cutoff / bin_thickness,
                    " times the cell's thickness along axis ", k, "; too many images to search");
      reach[size_t(k)] = std::max<int64_t>(1, int64_t(needed));
    }
    searched *= 2 * reach[size_t(k)] + 1;
    MPIGRAD_CHECK(searched <= 1000000, where, ": the cutoff ", cutoff,
                  " reaches more than a million periodic images of the cell; is the cell in the "
                  "same units as the positions?");
  }

  // Atoms by bin (counting sort: linear).
  const int64_t total_bins = bins[0] * bins[1] * bins[2];
  const size_t count = static_cast<size_t>(atoms);
  std::vector<int64_t> bin_of(count), bin_start(static_cast<size_t>(total_bins + 1), 0),
      members(count);
  std::vector<std::array<int64_t, 3>> cell_of(count);
  for (int64_t a = 0; a < atoms; ++a) {
    std::array<int64_t, 3> index{};
    for (int k = 0; k < 3; ++k) {
      const double extent = span[size_t(k)];
      const double position =
          extent > 0 ? (fractional[size_t(3 * a + k)] - low[size_t(k)]) / extent : 0.0;
      index[size_t(k)] =
          std::clamp<int64_t>(int64_t(position * double(bins[size_t(k)])), 0, bins[size_t(k)] - 1);
    }
    cell_of[size_t(a)] = index;
    bin_of[size_t(a)] = (index[0] * bins[1] + index[1]) * bins[2] + index[2];
    ++bin_start[size_t(bin_of[size_t(a)] + 1)];
  }
  std::partial_sum(bin_start.begin(), bin_start.end(), bin_start.begin());
  {
    std::vector<int64_t> fill(bin_start.begin(), bin_start.end() - 1);
    for (int64_t a = 0; a < atoms; ++a) members[size_t(fill[size_t(bin_of[size_t(a)])]++)] = a;
  }

  const double cutoff2 = cutoff * cutoff;
  std::vector<Candidate> found;
  for (int64_t target = 0; target < atoms; ++target) {
    found.clear();
    const std::array<int64_t, 3>& home = cell_of[size_t(target)];
    const double* rt = &wrapped[size_t(3 * target)];
    for (int64_t d0 = -reach[0]; d0 <= reach[0]; ++d0) {
      for (int64_t d1 = -reach[1]; d1 <= reach[1]; ++d1) {
        for (int64_t d2 = -reach[2]; d2 <= reach[2]; ++d2) {
          const std::array<int64_t, 3> step = {d0, d1, d2};
          std::array<int64_t, 3> bin{}, offset{};
          bool inside = true;
          for (int k = 0; k < 3 && inside; ++k) {
            const int64_t c = home[size_t(k)] + step[size_t(k)];
            if (pbc[size_t(k)]) {
              offset[size_t(k)] = floor_div(c, bins[size_t(k)]);
              bin[size_t(k)] = c - offset[size_t(k)] * bins[size_t(k)];
            } else {
              inside = c >= 0 && c < bins[size_t(k)];
              bin[size_t(k)] = c;
            }
          }
          if (!inside) continue;
          // The source's image sits at its wrapped position plus offset . basis.
          double translation[3];
          for (int c = 0; c < 3; ++c) {
            translation[c] = double(offset[0]) * basis[size_t(c)] +
                             double(offset[1]) * basis[size_t(3 + c)] +
                             double(offset[2]) * basis[size_t(6 + c)];
          }
          const int64_t b = (bin[0] * bins[1] + bin[1]) * bins[2] + bin[2];
          for (int64_t m = bin_start[size_t(b)]; m < bin_start[size_t(b + 1)]; ++m) {
            const int64_t source = members[size_t(m)];
            const bool own_image = offset[0] == 0 && offset[1] == 0 && offset[2] == 0;
            if (source == target && own_image && !options.self_loops) continue;
            const double* rs = &wrapped[size_t(3 * source)];
            double distance2 = 0;
            for (int c = 0; c < 3; ++c) {
              const double v = rt[c] - rs[c] - translation[c];
              distance2 += v * v;
            }
            if (distance2 >= cutoff2) continue;
            // In the positions as given: target - source + (w_s - w_t - offset) . basis.
            Candidate candidate{source, {}, distance2};
            for (int k = 0; k < 3; ++k) {
              candidate.image[size_t(k)] =
                  wrap[size_t(3 * source + k)] - wrap[size_t(3 * target + k)] - offset[size_t(k)];
            }
            found.push_back(candidate);
          }
        }
      }
    }
    if (options.max_neighbors > 0 && int64_t(found.size()) > options.max_neighbors) {
      const auto nearer = [](const Candidate& a, const Candidate& b) {
        return a.distance2 != b.distance2 ? a.distance2 < b.distance2 : edge_order(a, b);
      };
      std::nth_element(found.begin(), found.begin() + options.max_neighbors, found.end(), nearer);
      found.resize(size_t(options.max_neighbors));
    }
    std::sort(found.begin(), found.end(), edge_order);
    for (const Candidate& candidate : found) {
      edges.source.push_back(candidate.source);
      edges.target.push_back(target);
      for (int k = 0; k < 3; ++k) edges.image.push_back(candidate.image[size_t(k)]);
      for (int c = 0; c < 3; ++c) {
        double shift = 0;
        for (int k = 0; k < 3; ++k) {
          shift += double(candidate.image[size_t(k)]) * basis[size_t(3 * k + c)];
        }
        edges.shift.push_back(periodic ? shift : 0.0);
      }
    }
  }
  return edges;
}

namespace {

// The batch's field `name` as a contiguous CPU tensor of `dtype` and shape `shape`.
core::Tensor field_of(const Batch& batch, const std::string& name, core::DType dtype,
                      const core::Shape& shape) {
  const core::Tensor& tensor = batch[name];
  MPIGRAD_CHECK(tensor.device().is_cpu(), "radius_graph_transform: field '", name, "' is on ",
                tensor.device(), "; the neighbor list is built on the host, in the loader");
  MPIGRAD_CHECK(tensor.dtype() == dtype && tensor.shape() == shape,
                "radius_graph_transform: field '", name, "' is ", tensor.dtype(), " ",
                tensor.shape(), "; expected ", dtype, " ", shape);
  return tensor.contiguous();
}

// The search's frame of one structure (kernels/neighbor_list.h): radius_graph's basis, and how
// many images out a source may sit along each periodic axis. Wrapped fractional coordinates
// differ by less than 1, so an image n cells out is at least (|n| - 1) * height away across the
// faces: |n| <= floor(cutoff / height) + 1 covers every source within the cutoff.
kernels::NeighborFrame search_frame(const Matrix& cell, const std::array<bool, 3>& pbc,
                                    double cutoff, int64_t first, int64_t last,
                                    const std::string& where) {
  kernels::NeighborFrame frame{};
  const Matrix basis = search_basis(cell, pbc, where);
  const double det = determinant(basis);
  const Matrix inv = inverse(basis, det);
  int64_t searched = 1;
  for (int k = 0; k < 3; ++k) {
    frame.pbc[k] = pbc[size_t(k)] ? 1 : 0;
    if (!pbc[size_t(k)]) continue;
    const double cells = cutoff / height(basis, k, std::abs(det));
    MPIGRAD_CHECK(cells <= 1e6, where, ": the cutoff ", cutoff, " is ", cells,
                  " times the cell's thickness along axis ", k, "; too many images to search");
    frame.reach[k] = int64_t(std::floor(cells)) + 1;
    searched *= 2 * frame.reach[k] + 1;
    MPIGRAD_CHECK(searched <= 1000000, where, ": the cutoff ", cutoff,
                  " reaches more than a million periodic images of the cell; is the cell in the "
                  "same units as the positions?");
  }
  for (int i = 0; i < 9; ++i) {
    frame.basis[i] = basis[size_t(i)];
    frame.inverse[i] = inv[size_t(i)];
  }
  frame.first = first;
  frame.last = last;
  frame.periodic = pbc[0] || pbc[1] || pbc[2] ? 1 : 0;
  return frame;
}

// `values` (trivially copyable) as bytes on `device`, for the kernels' raw pointers.
template <typename T>
core::Tensor device_copy(const std::vector<T>& values, core::Device device) {
  std::vector<uint8_t> bytes(values.size() * sizeof(T));
  if (!bytes.empty()) std::memcpy(bytes.data(), values.data(), bytes.size());
  return core::Tensor::from_vector(bytes, {int64_t(bytes.size())}).to(device);
}

}  // namespace

BatchGraph radius_graph_batch(const core::Tensor& positions_in, const core::Tensor& atoms_ptr,
                              const core::Tensor& cell_in, const core::Tensor& pbc_in,
                              const NeighborListOptions& options, std::span<const int64_t> names) {
  const char* op = "radius_graph_batch";
  MPIGRAD_CHECK(std::isfinite(options.cutoff) && options.cutoff > 0, op,
                ": the cutoff must be positive, got ", options.cutoff);
  MPIGRAD_CHECK(options.max_neighbors >= 0, op, ": max_neighbors must be >= 0, got ",
                options.max_neighbors);
  MPIGRAD_CHECK(
      atoms_ptr.dtype() == core::kInt64 && atoms_ptr.dim() == 1 && atoms_ptr.shape()[0] >= 1, op,
      ": atoms_ptr must be int64 [B + 1], got ", atoms_ptr.dtype(), " ", atoms_ptr.shape());
  const std::vector<int64_t> ptr = atoms_ptr.to_vector<int64_t>();
  const int64_t structures = int64_t(ptr.size()) - 1;
  const int64_t atoms = ptr.back();
  const core::Device device = positions_in.device();
  MPIGRAD_CHECK(
      positions_in.dtype() == core::kFloat32 && positions_in.shape() == core::Shape({atoms, 3}), op,
      ": positions must be float32 [", atoms, ", 3] (atoms_ptr ends at ", atoms, "), got ",
      positions_in.dtype(), " ", positions_in.shape());
  std::vector<float> cell;
  std::vector<bool> pbc;
  if (cell_in.defined()) {
    MPIGRAD_CHECK(
        cell_in.dtype() == core::kFloat32 && cell_in.shape() == core::Shape({structures, 3, 3}), op,
        ": cell must be float32 [", structures, ", 3, 3], got ", cell_in.dtype(), " ",
        cell_in.shape());
    cell = cell_in.to_vector<float>();
  }
  if (pbc_in.defined()) {
    MPIGRAD_CHECK(pbc_in.dtype() == core::kBool && pbc_in.shape() == core::Shape({structures, 3}),
                  op, ": pbc must be bool [", structures, ", 3], got ", pbc_in.dtype(), " ",
                  pbc_in.shape());
    pbc = pbc_in.to_vector<bool>();
  }
  const auto where = [&](int64_t b) {
    const int64_t name = b < int64_t(names.size()) ? names[size_t(b)] : b;
    return std::string(op) + ": structure " + std::to_string(name);
  };

  std::vector<kernels::NeighborFrame> frames;
  std::vector<int64_t> structure_of(static_cast<size_t>(atoms));
  for (int64_t b = 0; b < structures; ++b) {
    const int64_t first = ptr[size_t(b)], last = ptr[size_t(b + 1)];
    MPIGRAD_CHECK(first >= 0 && first <= last && last <= atoms, op,
                  ": atoms_ptr is not a CSR pointer of ", atoms, " atoms at structure ", b);
    std::array<double, 9> box{};
    std::array<bool, 3> periodic{};
    for (int i = 0; i < 9 && !cell.empty(); ++i) box[size_t(i)] = double(cell[size_t(9 * b + i)]);
    for (int i = 0; i < 3 && !pbc.empty(); ++i) periodic[size_t(i)] = pbc[size_t(3 * b + i)];
    frames.push_back(search_frame(box, periodic, options.cutoff, first, last, where(b)));
    std::fill(structure_of.begin() + first, structure_of.begin() + last, b);
  }

  const core::Tensor positions = positions_in.contiguous();
  const core::Tensor frames_there = device_copy(frames, device);
  const core::Tensor structure_there = device_copy(structure_of, device);
  kernels::RadiusGraphArgs args;
  args.atoms = atoms;
  args.structures = structures;
  args.frames = static_cast<const kernels::NeighborFrame*>(frames_there.data_ptr());
  args.structure_of = static_cast<const int64_t*>(structure_there.data_ptr());
  args.positions = positions.data<float>();
  args.cutoff = options.cutoff;
  args.max_neighbors = options.max_neighbors;
  args.self_loops = options.self_loops;
  core::Backend& backend = core::backend_for(device);

  const core::TensorOptions longs = core::TensorOptions(core::kInt64).device(device);
  const core::Tensor counts = core::empty({atoms}, longs);
  const int64_t bad = backend.radius_graph_count(args, counts.data<int64_t>());
  if (bad >= 0) {
    const int64_t b = structure_of[size_t(bad)];
    core::fail(where(b), ": atom ", bad - ptr[size_t(b)],
               " has a position component that is not finite");
  }

  // Offsets of the kept edges, and scratch for the targets with more than max_neighbors.
  const std::vector<int64_t> found = counts.to_vector<int64_t>();
  std::vector<int64_t> offsets(size_t(atoms + 1), 0), scratch(size_t(atoms), -1);
  int64_t scratch_edges = 0;
  for (int64_t t = 0; t < atoms; ++t) {
    int64_t kept = found[size_t(t)];
    if (options.max_neighbors > 0 && kept > options.max_neighbors) {
      scratch[size_t(t)] = scratch_edges;
      scratch_edges += kept;
      kept = options.max_neighbors;
    }
    offsets[size_t(t + 1)] = offsets[size_t(t)] + kept;
  }
  const int64_t edges = offsets.back();
  BatchGraph graph;
  graph.edge_index = core::empty({2, edges}, longs);
  graph.edge_shifts = core::empty({edges, 3}, core::TensorOptions(core::kFloat32).device(device));
  const core::Tensor offsets_there = device_copy(offsets, device);
  core::Tensor scratch_there, scratch_source, scratch_image, scratch_distance2;
  kernels::RadiusGraphOutput out;
  out.offsets = static_cast<const int64_t*>(offsets_there.data_ptr());
  if (scratch_edges > 0) {
    scratch_there = device_copy(scratch, device);
    scratch_source = core::empty({scratch_edges}, longs);
    scratch_image = core::empty({scratch_edges, 3}, longs);
    scratch_distance2 =
        core::empty({scratch_edges}, core::TensorOptions(core::kFloat64).device(device));
    out.scratch_offsets = static_cast<const int64_t*>(scratch_there.data_ptr());
    out.scratch_source = scratch_source.data<int64_t>();
    out.scratch_image = scratch_image.data<int64_t>();
    out.scratch_distance2 = scratch_distance2.data<double>();
  }
  out.source = graph.edge_index.data<int64_t>();
  out.target = out.source + edges;
  out.shift = graph.edge_shifts.data<float>();
  if (edges > 0) backend.radius_graph_write(args, out);

  std::vector<int64_t> edges_ptr;
  for (int64_t first : ptr) edges_ptr.push_back(offsets[size_t(first)]);
  graph.edges_ptr = core::Tensor::from_vector(edges_ptr, {structures + 1}).to(device);
  return graph;
}

BatchTransform radius_graph_transform(NeighborListOptions options) {
  MPIGRAD_CHECK(std::isfinite(options.cutoff) && options.cutoff > 0,
                "radius_graph_transform: the cutoff must be positive, got ", options.cutoff);
  MPIGRAD_CHECK(options.max_neighbors >= 0,
                "radius_graph_transform: max_neighbors must be >= 0, got ", options.max_neighbors);
  return [options](Batch batch) {
    if (batch.has("positions") && batch["positions"].device().is_cuda()) {
      BatchGraph graph = radius_graph_batch(batch["positions"], batch["atoms_ptr"],
                                            batch.has("cell") ? batch["cell"] : core::Tensor(),
                                            batch.has("pbc") ? batch["pbc"] : core::Tensor(),
                                            options, batch.indices);
      batch.set("edge_index", std::move(graph.edge_index));
      batch.set("edge_shifts", std::move(graph.edge_shifts));
      batch.set("edges_ptr", std::move(graph.edges_ptr));
      return batch;
    }
    const int64_t structures = batch.size();
    const core::Tensor ptr_tensor = field_of(batch, "atoms_ptr", core::kInt64, {structures + 1});
    const int64_t* atoms_ptr = ptr_tensor.data<int64_t>();
    const int64_t atoms = atoms_ptr[structures];
    const core::Tensor positions_tensor = field_of(batch, "positions", core::kFloat32, {atoms, 3});
    const float* positions = positions_tensor.data<float>();
    core::Tensor cell_tensor, pbc_tensor;
    if (batch.has("cell"))
      cell_tensor = field_of(batch, "cell", core::kFloat32, {structures, 3, 3});
    if (batch.has("pbc")) pbc_tensor = field_of(batch, "pbc", core::kBool, {structures, 3});

    std::vector<int64_t> sources, targets, edges_ptr(size_t(structures + 1), 0);
    std::vector<float> shifts;
    std::vector<double> coordinates;
    for (int64_t b = 0; b < structures; ++b) {
      const int64_t first = atoms_ptr[b], last = atoms_ptr[b + 1];
      MPIGRAD_CHECK(first >= 0 && first <= last && last <= atoms,
                    "radius_graph_transform: field "
                    "'atoms_ptr' is not a CSR pointer of ",
                    atoms, " atoms at structure ", b);
      coordinates.assign(positions + 3 * first, positions + 3 * last);
      std::array<double, 9> cell{};
      std::array<bool, 3> pbc{};
      if (cell_tensor.defined()) {
        for (int i = 0; i < 9; ++i) cell[size_t(i)] = double(cell_tensor.data<float>()[9 * b + i]);
      }
      if (pbc_tensor.defined()) {
        for (int i = 0; i < 3; ++i) pbc[size_t(i)] = pbc_tensor.data<bool>()[3 * b + i];
      }
      const int64_t sample = b < int64_t(batch.indices.size()) ? batch.indices[size_t(b)] : b;
      const StructureEdges edges =
          radius_graph(coordinates, cell, pbc, options,
                       "radius_graph_transform: structure " + std::to_string(sample));
      for (int64_t e = 0; e < edges.size(); ++e) {
        sources.push_back(first + edges.source[size_t(e)]);
        targets.push_back(first + edges.target[size_t(e)]);
      }
      for (double shift : edges.shift) shifts.push_back(float(shift));
      edges_ptr[size_t(b + 1)] = edges_ptr[size_t(b)] + edges.size();
    }
    const int64_t count = int64_t(sources.size());
    core::Tensor edge_index = empty_batch_tensor({2, count}, core::kInt64);
    std::copy(sources.begin(), sources.end(), edge_index.data<int64_t>());
    std::copy(targets.begin(), targets.end(), edge_index.data<int64_t>() + count);
    core::Tensor edge_shifts = empty_batch_tensor({count, 3}, core::kFloat32);
    std::copy(shifts.begin(), shifts.end(), edge_shifts.data<float>());
    core::Tensor pointer = empty_batch_tensor({structures + 1}, core::kInt64);
    std::copy(edges_ptr.begin(), edges_ptr.end(), pointer.data<int64_t>());
    batch.set("edge_index", std::move(edge_index));
    batch.set("edge_shifts", std::move(edge_shifts));
    batch.set("edges_ptr", std::move(pointer));
    return batch;
  };
}

}  // namespace mpigrad::data
