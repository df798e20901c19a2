// One input-check helper for every launcher (CPU and CUDA). Messages name the op and
// the argument:  "decodekit::rms_norm: 'weight' must have 769 elements in dim 0, got 768".
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/util/Exception.h>

#include <initializer_list>
#include <sstream>

namespace dk {

class Check {
 public:
  Check(const char* op, const char* name, const at::Tensor& t) : op_(op), name_(name), t_(t) {
    fail_if(!t.defined(), "must be a defined tensor");
  }

  Check& dtype(std::initializer_list<at::ScalarType> allowed) {
    for (auto d : allowed)
      if (t_.scalar_type() == d) return *this;
    std::ostringstream os;
    os << "has dtype " << t_.scalar_type() << "; allowed:";
    for (auto d : allowed) os << " " << d;
    return fail(os.str());
  }
  Check& dtype_as(const at::Tensor& other, const char* other_name) {
    if (t_.scalar_type() != other.scalar_type())
      fail(std::string("has dtype ") + c10::toString(t_.scalar_type()) + " but must match '" + other_name +
           "' (" + c10::toString(other.scalar_type()) + ")");
    return *this;
  }
  Check& device_as(const at::Tensor& other, const char* other_name) {
    if (t_.device() != other.device())
      fail("is on " + t_.device().str() + " but must be on the same device as '" + other_name + "' (" +
           other.device().str() + ")");
    return *this;
  }
  Check& dim(int64_t d) {
    if (t_.dim() != d) fail("must have " + std::to_string(d) + " dims, got shape " + shape_str());
    return *this;
  }
  Check& min_dim(int64_t d) {
    if (t_.dim() < d) fail("must have at least " + std::to_string(d) + " dims, got shape " + shape_str());
    return *this;
  }
  Check& size(int64_t d, int64_t expected, const char* what = "") {
    const int64_t got = t_.size(d);
    if (got != expected)
      fail("must have size " + std::to_string(expected) + (what[0] ? std::string(" (") + what + ")" : "") +
           " in dim " + std::to_string(d) + ", got shape " + shape_str());
    return *this;
  }
  Check& same_shape(const at::Tensor& other, const char* other_name) {
    if (!t_.sizes().equals(other.sizes()))
      fail("has shape " + shape_str() + " but must match '" + other_name + "' " + shape_of(other));
    return *this;
  }
  Check& contiguous() {
    fail_if(!t_.is_contiguous(), "must be contiguous");
    return *this;
  }
  Check& last_dim_contiguous() {
    fail_if(t_.dim() > 0 && t_.size(-1) > 1 && t_.stride(-1) != 1, "must have a contiguous last dim (stride 1)");
    return *this;
  }
  Check& aligned(int64_t bytes) {
    fail_if(reinterpret_cast<uintptr_t>(t_.data_ptr()) % bytes != 0,
            ("data must be " + std::to_string(bytes) + "-byte aligned").c_str());
    return *this;
  }

  // Views the tensor as [rows, last] with a single row stride; the leading dims must
  // collapse (e.g. a slice x[:, :h] of a wider tensor is fine, a transposed one is not).
  // Size-1 leading dims carry no addressing (their strides are arbitrary) and are skipped:
  // the row stride is the stride of the innermost leading dim with more than one element
  // (x[:, None, :h] has row stride x.stride(0), not h).
  int64_t row_stride() {
    last_dim_contiguous();
    const int64_t nd = t_.dim();
    if (nd <= 1) return t_.dim() == 1 ? t_.size(0) : 1;
    if (t_.numel() == 0) return t_.size(-1);  // no rows are addressed
    int64_t rs = -1, next = 0;  // row stride; the stride the next outer dim must have
    for (int64_t i = nd - 2; i >= 0; --i) {
      if (t_.size(i) == 1) continue;
      if (rs >= 0 && t_.stride(i) != next)
        fail("has strides that do not collapse to [rows, " + std::to_string(t_.size(-1)) + "] (shape " +
             shape_str() + ", strides " + strides_str() + ")");
      if (rs < 0) rs = t_.stride(i);
      next = t_.stride(i) * t_.size(i);
    }
    return rs < 0 ? t_.size(-1) : rs;
  }

  [[noreturn]] Check& fail(const std::string& msg) {
    TORCH_CHECK(false, op_, ": '", name_, "' ", msg);
  }

 private:
  void fail_if(bool cond, const char* msg) {
    if (cond) fail(msg);
  }
  std::string shape_str() const { return shape_of(t_); }
  std::string strides_str() const {
    std::ostringstream os;
    os << t_.strides();
    return os.str();
  }
  static std::string shape_of(const at::Tensor& t) {
    std::ostringstream os;
    os << t.sizes();
    return os.str();
  }
  const char* op_;
  const char* name_;
  const at::Tensor& t_;
};

// A scalar argument outside its range.
template <class V>
inline void check_range(const char* op, const char* name, V v, V lo, V hi) {
  TORCH_CHECK(v >= lo && v <= hi, op, ": '", name, "' must be in [", lo, ", ", hi, "], got ", v);
}

inline int64_t rows_of(const at::Tensor& t) { return t.dim() == 0 || t.size(-1) == 0 ? 0 : t.numel() / t.size(-1); }

}  // namespace dk
