#include "checks.h"

#include <cmath>
#include <sstream>
#include <string>
#include <utility>

namespace gpuopt {
namespace {

// Python spelling of dtypes, so C++ and Python errors read the same.
std::string dtype_name(ScalarType t) {
  static const std::pair<ScalarType, const char*> kNames[] = {{kFloat, "float32"},
                                                              {kDouble, "float64"},
                                                              {kHalf, "float16"},
                                                              {kBFloat16, "bfloat16"},
                                                              {kLong, "int64"},
                                                              {ScalarType::Int, "int32"},
                                                              {ScalarType::Short, "int16"},
                                                              {ScalarType::Char, "int8"},
                                                              {ScalarType::Byte, "uint8"},
                                                              {ScalarType::Bool, "bool"},
                                                              {ScalarType::ComplexFloat, "complex64"},
                                                              {ScalarType::ComplexDouble, "complex128"}};
  for (const auto& [dtype, name] : kNames)
    if (dtype == t) return std::string("torch.") + name;
  return std::string("torch.") + torch::headeronly::toString(t);
}
std::string dtype_name(DType t) { return dtype_name(scalar_type_of(t)); }

std::string shape_str(IntArrayRef sizes) {
  std::ostringstream s;
  s << "(";
  for (size_t i = 0; i < sizes.size(); ++i) s << (i ? ", " : "") << sizes[i];
  if (sizes.size() == 1) s << ",";
  s << ")";
  return s.str();
}

bool is_float_dtype(ScalarType t) { return t == kFloat || t == kHalf || t == kBFloat16 || t == kDouble; }

void check_input(const char* op, const char* name, const Tensor& t) {
  GPUOPT_CHECK(is_float_dtype(t.scalar_type()), "gpuopt.", op, ": ", name,
               " must be float32, float16, bfloat16 or float64, got ", dtype_name(t.scalar_type()));
  GPUOPT_CHECK(t.dim() >= 1, "gpuopt.", op, ": ", name, " must have at least 1 dimension, got a 0-dim tensor");
  GPUOPT_CHECK(last_dim(t) > 0, "gpuopt.", op, ": ", name, " must have a non-empty last dimension, got shape ",
               shape_str(t.sizes()));
}

void check_device(const char* op, const char* name, const Tensor& t, const Tensor& x, const char* x_name = "x") {
  GPUOPT_CHECK(t.device() == x.device(), "gpuopt.", op, ": ", name, " must be on ", device_str(x.device()), " like ",
               x_name, ", got ", device_str(t.device()));
}

void check_same(const char* op, const char* name, const Tensor& t, const char* ref_name, const Tensor& ref) {
  check_device(op, name, t, ref);
  GPUOPT_CHECK(t.scalar_type() == ref.scalar_type(), "gpuopt.", op, ": ", name, " must have dtype ",
               dtype_name(ref.scalar_type()), " like ", ref_name, ", got ", dtype_name(t.scalar_type()));
  GPUOPT_CHECK(same_sizes(t.sizes(), ref.sizes()), "gpuopt.", op, ": ", name, " must have shape ",
               shape_str(ref.sizes()), " like ", ref_name, ", got ", shape_str(t.sizes()));
}

// weight / bias: shape (N,), x's device, dtype of x or float32.
void check_param(const char* op, const char* name, const Tensor& t, const Tensor& x, int64_t N,
                 const char* x_name = "x") {
  check_device(op, name, t, x, x_name);
  GPUOPT_CHECK(t.scalar_type() == x.scalar_type() || t.scalar_type() == kFloat, "gpuopt.", op, ": ", name,
               " must have dtype ", dtype_name(x.scalar_type()), " (like ", x_name, ") or torch.float32, got ",
               dtype_name(t.scalar_type()));
  GPUOPT_CHECK(t.dim() == 1 && t.size(0) == N, "gpuopt.", op, ": ", name, " must have shape (", N,
               ",) to match the last dimension of ", x_name, ", got ", shape_str(t.sizes()));
}

void check_vector(const char* op, const char* name, const Tensor& t, const Tensor& x, int64_t M, ScalarType dtype,
                  const char* x_name = "x") {
  check_device(op, name, t, x, x_name);
  GPUOPT_CHECK(t.scalar_type() == dtype, "gpuopt.", op, ": ", name, " must have dtype ", dtype_name(dtype), ", got ",
               dtype_name(t.scalar_type()));
  GPUOPT_CHECK(t.dim() == 1 && t.size(0) == M, "gpuopt.", op, ": ", name, " must have shape (", M,
               ",) (one entry per row of ", x_name, "), got ", shape_str(t.sizes()));
}

// weight / bias of the row tensor x (named x_name): returns the parameter dtype (x's when both are absent).
ScalarType check_params(const char* op, const Tensor& x, const char* x_name, const std::optional<Tensor>& weight,
                        const std::optional<Tensor>& bias, int64_t N) {
  ScalarType param_dtype = x.scalar_type();
  const bool has_w = weight.has_value() && weight->defined();
  const bool has_b = bias.has_value() && bias->defined();
  if (has_w) {
    check_param(op, "weight", *weight, x, N, x_name);
    param_dtype = weight->scalar_type();
  }
  if (has_b) {
    check_param(op, "bias", *bias, x, N, x_name);
    if (has_w) {
      GPUOPT_CHECK(bias->scalar_type() == weight->scalar_type(), "gpuopt.", op,
                   ": bias must have the dtype of weight (", dtype_name(weight->scalar_type()), "), got ",
                   dtype_name(bias->scalar_type()));
    }
    param_dtype = bias->scalar_type();
  }
  return param_dtype;
}

// mean ((M,), or (0,) when rms) and rstd ((M,)) of the row tensor x (named x_name), in the accumulation dtype.
void check_stats(const char* op, const Tensor& mean, const Tensor& rstd, const Tensor& x, const char* x_name, int64_t M,
                 DType acc, bool rms) {
  const ScalarType acc_t = scalar_type_of(acc);
  if (rms) {
    check_device(op, "mean", mean, x, x_name);
    GPUOPT_CHECK(mean.scalar_type() == acc_t, "gpuopt.", op, ": mean must have dtype ", dtype_name(acc_t), ", got ",
                 dtype_name(mean.scalar_type()));
    GPUOPT_CHECK(mean.dim() == 1 && mean.size(0) == 0, "gpuopt.", op,
                 ": mean must have shape (0,) when rms is true, got ", shape_str(mean.sizes()));
  } else {
    check_vector(op, "mean", mean, x, M, acc_t, x_name);
  }
  check_vector(op, "rstd", rstd, x, M, acc_t, x_name);
}

// seed (int64 on x's device: one element, or a shard map [seed, base, period, jump]) and p in [0, 1]: the
// quantized dropout parameters. `unit`: what a map's base (and, unless jump is 0, period and jump) must be
// multiples of (N for the row ops, 8 for gated_act). A CPU map is checked here; a GPU one is read on the device only (checking it would wait for the
// device), so its maker keeps the rule: gpuopt_ops.dtensor.shard_seed, which checks it on the host first.
DropoutParams check_seed_p(const char* op, const Tensor& seed, const Tensor& x, const char* x_name, double p,
                           int64_t unit) {
  check_device(op, "seed", seed, x, x_name);
  GPUOPT_CHECK(seed.scalar_type() == kLong, "gpuopt.", op, ": seed must have dtype torch.int64, got ",
               dtype_name(seed.scalar_type()));
  GPUOPT_CHECK(seed.numel() == 1 || (seed.numel() == 4 && seed.is_contiguous()), "gpuopt.", op,
               ": seed must have 1 element (the seed) or 4 contiguous ones (seed, base, period, jump: a shard's "
               "numbering), got shape ",
               shape_str(seed.sizes()));
  GPUOPT_CHECK(p >= 0.0 && p <= 1.0, "gpuopt.", op, ": p must be in [0, 1], got ", p);
  DropoutParams d = make_dropout_params(p);
  d.mapped = seed.numel() == 4;
  if (d.mapped && seed.device().type() == torch::headeronly::DeviceType::CPU && d.active()) {
    const int64_t* m = data_as<const int64_t>(seed);
    const bool ok = m[1] >= 0 && m[2] >= 1 && m[3] >= 0 && m[1] % unit == 0 &&
                    (m[3] == 0 || (m[2] % unit == 0 && m[3] % unit == 0));
    GPUOPT_CHECK(ok, "gpuopt.", op, ": the seed's shard map (base ", m[1], ", period ", m[2], ", jump ", m[3],
                 ") must have base >= 0, period >= 1, jump >= 0, base a multiple of ", unit,
                 " and, unless jump is 0, period and jump too");
  }
  return d;
}

Tensor defined_or_empty(const std::optional<Tensor>& t) {
  return t.has_value() && t->defined() ? as_contiguous(*t) : Tensor();
}

// The operands every norm spec keeps, once checked: weight and bias (contiguous or undefined) and the seed.
template <class Spec>
void keep_params(Spec& s, const std::optional<Tensor>& weight, const std::optional<Tensor>& bias, const Tensor& seed) {
  s.weight = defined_or_empty(weight);
  s.bias = defined_or_empty(bias);
  s.seed = as_contiguous(seed);
}

// The row tensor t (named name) of a row op's spec: M rows of N, t's dtype and its accumulation dtype.
template <class Spec>
Spec rows_spec(const char* op, const char* name, const Tensor& t) {
  check_input(op, name, t);
  Spec s;
  s.N = last_dim(t);
  s.M = rows_of(t, s.N);
  s.x_dtype = dtype_of(t.scalar_type());
  s.acc_dtype = acc_dtype_of(s.x_dtype);
  return s;
}

NormSpec check_norm_common(const char* op, const Tensor& x, const std::optional<Tensor>& weight,
                           const std::optional<Tensor>& bias, const Tensor& seed, double p, bool rms, bool relu) {
  NormSpec s = rows_spec<NormSpec>(op, "x", x);
  s.param_dtype = dtype_of(check_params(op, x, "x", weight, bias, s.N));
  s.dropout = check_seed_p(op, seed, x, "x", p, last_dim(x));
  s.rms = rms;
  s.relu = relu;
  s.x = as_contiguous(x);
  keep_params(s, weight, bias, seed);
  return s;
}

void check_eps(const char* op, double eps) {
  GPUOPT_CHECK(eps > 0.0 && std::isfinite(eps), "gpuopt.", op, ": eps must be a finite number > 0, got ", eps);
}

void check_act(const char* op, int64_t act) {
  GPUOPT_CHECK(valid_act(act), "gpuopt.", op, ": act must be 0 (relu), 1 (gelu), 2 (gelu_tanh) or 3 (silu), got ", act);
}

}  // namespace

namespace {

NormSpec check_norm_forward(const char* op, const Tensor& x, const std::optional<Tensor>& weight,
                            const std::optional<Tensor>& bias, const Tensor& seed, double p, double eps, bool rms,
                            bool relu) {
  NormSpec s = check_norm_common(op, x, weight, bias, seed, p, rms, relu);
  check_eps(op, eps);
  s.eps = eps;
  return s;
}

NormSpec check_norm_backward(const char* op, const Tensor& grad_out, const Tensor& x,
                             const std::optional<Tensor>& weight, const std::optional<Tensor>& bias, const Tensor& mean,
                             const Tensor& rstd, const Tensor& seed, double p, bool rms, bool relu) {
  NormSpec s = check_norm_common(op, x, weight, bias, seed, p, rms, relu);
  check_same(op, "grad_out", grad_out, "x", x);
  check_stats(op, mean, rstd, x, "x", s.M, s.acc_dtype, rms);
  s.grad_out = as_contiguous(grad_out);
  s.mean = as_contiguous(mean);
  s.rstd = as_contiguous(rstd);
  return s;
}

}  // namespace

NormSpec check_ldr_forward(const Tensor& x, const std::optional<Tensor>& weight, const std::optional<Tensor>& bias,
                           const Tensor& seed, double p, double eps) {
  return check_norm_forward("layer_norm_dropout_relu", x, weight, bias, seed, p, eps, false, true);
}

NormSpec check_ldr_backward(const Tensor& grad_out, const Tensor& x, const std::optional<Tensor>& weight,
                            const std::optional<Tensor>& bias, const Tensor& mean, const Tensor& rstd,
                            const Tensor& seed, double p) {
  return check_norm_backward("layer_norm_dropout_relu_backward", grad_out, x, weight, bias, mean, rstd, seed, p, false,
                             true);
}

NormSpec check_norm_dropout(const Tensor& x, const std::optional<Tensor>& weight, const std::optional<Tensor>& bias,
                            const Tensor& seed, double p, double eps, bool rms, bool relu) {
  return check_norm_forward("norm_dropout", x, weight, bias, seed, p, eps, rms, relu);
}

NormSpec check_norm_dropout_backward(const Tensor& grad_out, const Tensor& x, const std::optional<Tensor>& weight,
                                     const std::optional<Tensor>& bias, const Tensor& mean, const Tensor& rstd,
                                     const Tensor& seed, double p, bool rms, bool relu) {
  return check_norm_backward("norm_dropout_backward", grad_out, x, weight, bias, mean, rstd, seed, p, rms, relu);
}

namespace {

// bias of the bias-act ops: (N,) of x's dtype or fp32, on x's device (x named x_name).
void check_bias(const char* op, BiasActSpec& s, const Tensor& bias, const Tensor& x, const char* x_name) {
  check_param(op, "bias", bias, x, s.N, x_name);
  s.bias = as_contiguous(bias);
  s.bias_dtype = dtype_of(bias.scalar_type());
}

// The row tensor t (x, out or saved) of the bias-act ops: M, N and the dtypes.
BiasActSpec bias_act_rows(const char* op, const char* name, const Tensor& t, int64_t act) {
  BiasActSpec s = rows_spec<BiasActSpec>(op, name, t);
  s.act = static_cast<int>(act);
  s.bias_dtype = s.x_dtype;
  return s;
}

}  // namespace

BiasActSpec check_bias_relu(const Tensor& x, const Tensor& bias) {
  const char* op = "bias_relu";
  BiasActSpec s = bias_act_rows(op, "x", x, kActRelu);
  check_bias(op, s, bias, x, "x");
  s.x = as_contiguous(x);
  return s;
}

BiasActSpec check_bias_relu_backward(const Tensor& grad_out, const Tensor& out) {
  const char* op = "bias_relu_backward";
  BiasActSpec s = bias_act_rows(op, "out", out, kActRelu);
  check_same(op, "grad_out", grad_out, "out", out);
  s.grad_out = as_contiguous(grad_out);
  s.saved = as_contiguous(out);
  return s;
}

AddNormSpec check_dropout_add_norm(const Tensor& x, const std::optional<Tensor>& residual,
                                   const std::optional<Tensor>& weight, const std::optional<Tensor>& bias,
                                   const Tensor& seed, double p, double eps, bool rms, bool residual_in_fp32) {
  const char* op = "dropout_add_norm";
  AddNormSpec a = rows_spec<AddNormSpec>(op, "x", x);
  a.rms = rms;
  a.eps = eps;
  a.sum_dtype = residual_in_fp32 && is_16bit(a.x_dtype) ? DType::kFloat32 : a.x_dtype;
  a.param_dtype = dtype_of(check_params(op, x, "x", weight, bias, a.N));
  if (residual.has_value() && residual->defined()) {
    const Tensor& r = *residual;
    check_device(op, "residual", r, x);
    const ScalarType rt = r.scalar_type();
    if (a.sum_dtype != a.x_dtype) {
      GPUOPT_CHECK(rt == kFloat, "gpuopt.", op, ": residual must have dtype torch.float32 (residual_in_fp32=True",
                   " with x of dtype ", dtype_name(a.x_dtype), "), got ", dtype_name(rt));
    } else if (rt == kFloat && is_16bit(a.x_dtype)) {
      fail(str_cat("gpuopt.", op, ": residual must have dtype ", dtype_name(a.x_dtype),
                   " like x, got torch.float32 (an fp32 residual needs residual_in_fp32=True)"));
    } else {
      GPUOPT_CHECK(rt == x.scalar_type(), "gpuopt.", op, ": residual must have dtype ", dtype_name(a.x_dtype),
                   " like x, got ", dtype_name(rt));
    }
    GPUOPT_CHECK(same_sizes(r.sizes(), x.sizes()), "gpuopt.", op, ": residual must have shape ", shape_str(x.sizes()),
                 " like x, got ", shape_str(r.sizes()));
  }
  a.dropout = check_seed_p(op, seed, x, "x", p, last_dim(x));
  check_eps(op, eps);
  a.x = as_contiguous(x);
  a.residual = defined_or_empty(residual);
  keep_params(a, weight, bias, seed);
  return a;
}

AddNormSpec check_dropout_add_norm_backward(const Tensor& grad_out, const std::optional<Tensor>& grad_sum,
                                            const Tensor& sum, const std::optional<Tensor>& weight,
                                            const std::optional<Tensor>& bias, const Tensor& mean, const Tensor& rstd,
                                            const Tensor& seed, double p, bool rms, bool has_residual) {
  const char* op = "dropout_add_norm_backward";
  AddNormSpec b = rows_spec<AddNormSpec>(op, "grad_out", grad_out);
  b.rms = rms;
  b.has_residual = has_residual;
  check_device(op, "sum", sum, grad_out, "grad_out");
  const ScalarType st = sum.scalar_type();
  if (is_16bit(b.x_dtype)) {
    GPUOPT_CHECK(st == grad_out.scalar_type() || st == kFloat, "gpuopt.", op, ": sum must have dtype ",
                 dtype_name(b.x_dtype), " (like grad_out) or torch.float32 (residual_in_fp32), got ", dtype_name(st));
  } else {
    GPUOPT_CHECK(st == grad_out.scalar_type(), "gpuopt.", op, ": sum must have dtype ", dtype_name(b.x_dtype),
                 " like grad_out, got ", dtype_name(st));
  }
  GPUOPT_CHECK(same_sizes(sum.sizes(), grad_out.sizes()), "gpuopt.", op, ": sum must have shape ",
               shape_str(grad_out.sizes()), " like grad_out, got ", shape_str(sum.sizes()));
  b.sum_dtype = dtype_of(st);
  if (grad_sum.has_value() && grad_sum->defined()) check_same(op, "grad_sum", *grad_sum, "sum", sum);
  b.param_dtype = dtype_of(check_params(op, grad_out, "grad_out", weight, bias, b.N));
  check_stats(op, mean, rstd, grad_out, "grad_out", b.M, b.acc_dtype, rms);
  b.dropout = check_seed_p(op, seed, grad_out, "grad_out", p, last_dim(grad_out));
  b.grad_out = as_contiguous(grad_out);
  b.grad_sum = defined_or_empty(grad_sum);
  b.sum = as_contiguous(sum);
  b.mean = as_contiguous(mean);
  b.rstd = as_contiguous(rstd);
  keep_params(b, weight, bias, seed);
  return b;
}

BiasActSpec check_bias_act(const Tensor& x, const Tensor& bias, int64_t act) {
  const char* op = "bias_act";
  check_act(op, act);
  BiasActSpec s = bias_act_rows(op, "x", x, act);
  check_bias(op, s, bias, x, "x");
  s.x = as_contiguous(x);
  return s;
}

BiasActSpec check_bias_act_backward(const Tensor& grad_out, const Tensor& saved, const Tensor& bias, int64_t act) {
  const char* op = "bias_act_backward";
  check_act(op, act);
  BiasActSpec s = bias_act_rows(op, "saved", saved, act);
  check_same(op, "grad_out", grad_out, "saved", saved);
  check_bias(op, s, bias, saved, "x");
  s.grad_out = as_contiguous(grad_out);
  s.saved = as_contiguous(saved);
  return s;
}

namespace {

// gate / up of gated_act and its backward: returns the args with gate, up, M, F, act and the dropout set.
GatedSpec check_gated_inputs(const char* op, const Tensor& gate, const std::optional<Tensor>& up, const Tensor& seed,
                             double p, int64_t act) {
  check_act(op, act);
  check_input(op, "gate", gate);
  GatedSpec a;
  const int64_t last = last_dim(gate);
  if (up.has_value() && up->defined()) {
    check_same(op, "up", *up, "gate", gate);
    a.F = last;
    a.up = as_contiguous(*up);
  } else {
    GPUOPT_CHECK(last % 2 == 0, "gpuopt.", op,
                 ": gate must have an even last dimension (its halves are [gate | up]) when up is None, got shape ",
                 shape_str(gate.sizes()));
    a.F = last / 2;
  }
  a.M = rows_of(gate, last);
  a.act = static_cast<int>(act);
  a.dtype = dtype_of(gate.scalar_type());
  a.dropout = check_seed_p(op, seed, gate, "gate", p, 8);
  a.gate = as_contiguous(gate);
  a.seed = as_contiguous(seed);
  return a;
}

}  // namespace

GatedSpec check_gated_act(const Tensor& gate, const std::optional<Tensor>& up, const Tensor& seed, double p,
                          int64_t act) {
  return check_gated_inputs("gated_act", gate, up, seed, p, act);
}

GatedSpec check_gated_act_backward(const Tensor& grad_out, const Tensor& gate, const std::optional<Tensor>& up,
                                   const Tensor& seed, double p, int64_t act) {
  const char* op = "gated_act_backward";
  GatedSpec a = check_gated_inputs(op, gate, up, seed, p, act);
  check_device(op, "grad_out", grad_out, gate, "gate");
  GPUOPT_CHECK(grad_out.scalar_type() == gate.scalar_type(), "gpuopt.", op, ": grad_out must have dtype ",
               dtype_name(gate.scalar_type()), " like gate, got ", dtype_name(grad_out.scalar_type()));
  bool same = grad_out.dim() == gate.dim();
  for (int64_t d = 0; same && d < gate.dim(); ++d) {
    same = grad_out.size(d) == (d == gate.dim() - 1 ? a.F : gate.size(d));
  }
  GPUOPT_CHECK(same, "gpuopt.", op, ": grad_out must have the output's shape (gate's, last dimension ", a.F, "), got ",
               shape_str(grad_out.sizes()));
  a.grad_out = as_contiguous(grad_out);
  return a;
}

}  // namespace gpuopt
