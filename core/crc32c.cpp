#include "mpigrad/core/crc32c.h"

#include <boost/crc.hpp>
#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_acle.h>
#include <sys/auxv.h>
#endif

namespace mpigrad::core {

namespace {

// The CRC below works on the register: crc32c(data, crc) = ~register(data, ~crc). In that form
// CRCs are linear, register(B, x) = register(B, 0) ^ shift(x, |B|), which is what lets three
// streams run side by side and be joined.

constexpr uint32_t kPolynomial = 0x82F63B78u;  // Castagnoli, reflected

uint32_t reflect(uint32_t value) {
  uint32_t reflected = 0;
  for (int bit = 0; bit < 32; ++bit) {
    if ((value >> bit) & 1u) reflected |= 1u << (31 - bit);
  }
  return reflected;
}

// The table version (Boost.CRC), for CPUs without the instruction.
uint32_t register_portable(const void* data, size_t size, uint32_t reg) {
  // Castagnoli polynomial, reflected in and out. Boost takes the initial remainder unreflected.
  boost::crc_optimal<32, 0x1EDC6F41, 0, 0, true, true> raw(reflect(reg));
  raw.process_bytes(data, size);
  return raw.checksum();
}

// a * b modulo the polynomial, both reflected (bit 31 is x^0): 32 steps, for joining streams.
uint32_t multiply(uint32_t a, uint32_t b) {
  uint32_t product = 0;
  for (int bit = 0; bit < 32; ++bit) {
    if (a & (0x80000000u >> bit)) product ^= b;
    b = (b & 1u) ? (b >> 1) ^ kPolynomial : b >> 1;
  }
  return product;
}

// x^(8 * bytes) modulo the polynomial, reflected: shifting a register by `bytes` zero bytes is
// a multiplication by it.
uint32_t shift_factor(size_t bytes) {
  uint32_t factor = 0x80000000u;  // x^0
  uint32_t power = 0x00800000u;   // x^8: one byte
  for (size_t n = bytes; n != 0; n >>= 1) {
    if (n & 1u) factor = multiply(factor, power);
    power = multiply(power, power);
  }
  return factor;
}

// Three streams of this many bytes each per round: the crc32 instruction has a latency of 3
// cycles and a throughput of 1, so three independent streams keep it busy.
constexpr size_t kStream = 8192;

#if defined(__x86_64__)
#define MPIGRAD_CRC32C_HARDWARE 1
__attribute__((target("sse4.2"))) uint32_t register_hardware(const void* data, size_t size,
                                                             uint32_t reg) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  uint64_t r = reg;
  // Head: up to 8-byte alignment.
  while (size > 0 && (reinterpret_cast<uintptr_t>(bytes) & 7u) != 0) {
    r = _mm_crc32_u8(uint32_t(r), *bytes++);
    --size;
  }
  static const uint32_t join = shift_factor(kStream);
  while (size >= 3 * kStream) {
    uint64_t a = r, b = 0, c = 0;
    const unsigned char* p = bytes;
    for (size_t i = 0; i < kStream; i += 8) {
      uint64_t wa, wb, wc;
      std::memcpy(&wa, p + i, 8);
      std::memcpy(&wb, p + kStream + i, 8);
      std::memcpy(&wc, p + 2 * kStream + i, 8);
      a = _mm_crc32_u64(a, wa);
      b = _mm_crc32_u64(b, wb);
      c = _mm_crc32_u64(c, wc);
    }
    r = multiply(multiply(uint32_t(a), join) ^ uint32_t(b), join) ^ uint32_t(c);
    bytes += 3 * kStream;
    size -= 3 * kStream;
  }
  for (; size >= 8; size -= 8, bytes += 8) {
    uint64_t word;
    std::memcpy(&word, bytes, 8);
    r = _mm_crc32_u64(r, word);
  }
  while (size-- > 0) r = _mm_crc32_u8(uint32_t(r), *bytes++);
  return uint32_t(r);
}

bool hardware_available() {
  static const bool available = __builtin_cpu_supports("sse4.2");
  return available;
}

#elif defined(__aarch64__)
#define MPIGRAD_CRC32C_HARDWARE 1
__attribute__((target("+crc"))) uint32_t register_hardware(const void* data, size_t size,
                                                           uint32_t reg) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  uint32_t r = reg;
  while (size > 0 && (reinterpret_cast<uintptr_t>(bytes) & 7u) != 0) {
    r = __crc32cb(r, *bytes++);
    --size;
  }
  static const uint32_t join = shift_factor(kStream);
  while (size >= 3 * kStream) {
    uint32_t a = r, b = 0, c = 0;
    for (size_t i = 0; i < kStream; i += 8) {
      uint64_t wa, wb, wc;
      std::memcpy(&wa, bytes + i, 8);
      std::memcpy(&wb, bytes + kStream + i, 8);
      std::memcpy(&wc, bytes + 2 * kStream + i, 8);
      a = __crc32cd(a, wa);
      b = __crc32cd(b, wb);
      c = __crc32cd(c, wc);
    }
    r = multiply(multiply(a, join) ^ b, join) ^ c;
    bytes += 3 * kStream;
    size -= 3 * kStream;
  }
  for (; size >= 8; size -= 8, bytes += 8) {
    uint64_t word;
    std::memcpy(&word, bytes, 8);
    r = __crc32cd(r, word);
  }
  while (size-- > 0) r = __crc32cb(r, *bytes++);
  return r;
}

bool hardware_available() {
  static const bool available = (getauxval(AT_HWCAP) & HWCAP_CRC32) != 0;
  return available;
}

#else
bool hardware_available() {
  return false;
}
#endif

}  // namespace

uint32_t crc32c(const void* data, size_t size, uint32_t crc) {
#if defined(MPIGRAD_CRC32C_HARDWARE)
  if (hardware_available()) return ~register_hardware(data, size, ~crc);
#endif
  return ~register_portable(data, size, ~crc);
}

namespace detail {

uint32_t crc32c_portable(const void* data, size_t size, uint32_t crc) {
  return ~register_portable(data, size, ~crc);
}

bool crc32c_in_hardware() {
  return hardware_available();
}

}  // namespace detail

}  // namespace mpigrad::core
