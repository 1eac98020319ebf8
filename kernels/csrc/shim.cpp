// The boxed-dispatch shim of tensile-kernels: finds any ATen operator by its
// schema name and overload, describes its arguments, and calls it with
// c10::IValues in schema order. Every C++ exception is caught here and
// returned as a message: none unwinds into Rust. Tensors cross as at::Tensor*
// (what tch's C_tensor is); tensors handed back are new heap at::Tensor
// objects that the caller owns (tch's Tensor::from_ptr frees them).
#include <ATen/ATen.h>
#include <ATen/ScalarOps.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/core/AllocatorConfig.h>
#include <c10/core/CachingDeviceAllocator.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <vector>

extern "C" {

// One argument handed in from Rust, in schema order.
struct tk_arg {
  int32_t kind;
  int64_t i;  // int value, enum value, device type
  int64_t j;  // device index (-1: none)
  double f;
  const void* p;  // tensor, array of tensors / ints / doubles / bytes, string
  size_t n;       // array or string length
};

enum tk_kind : int32_t {
  TK_DEFAULT = 0,
  TK_NONE = 1,
  TK_TENSOR = 2,
  TK_TENSOR_LIST = 3,
  TK_OPT_TENSOR_LIST = 4,
  TK_INT = 5,
  TK_FLOAT = 6,
  TK_BOOL = 7,
  TK_INT_LIST = 8,
  TK_FLOAT_LIST = 9,
  TK_BOOL_LIST = 10,
  TK_SCALAR_INT = 11,
  TK_SCALAR_FLOAT = 12,
  TK_SCALAR_BOOL = 13,
  TK_WRAPPED_INT = 14,
  TK_WRAPPED_FLOAT = 15,
  TK_WRAPPED_BOOL = 16,
  TK_STRING = 17,
  TK_DTYPE = 18,
  TK_MEMORY_FORMAT = 19,
  TK_LAYOUT = 20,
  TK_DEVICE = 21,
};

}  // extern "C"

namespace {

char* dup(const std::string& s) {
  char* out = static_cast<char*>(std::malloc(s.size() + 1));
  if (out != nullptr) {
    std::memcpy(out, s.data(), s.size());
    out[s.size()] = '\0';
  }
  return out;
}

void set_error(char** err, const std::string& s) {
  if (err != nullptr) *err = dup(s);
}

// Runs `body` and returns what it returns; a C++ exception becomes *err (a
// c10::Error without its backtrace) and `failed` is returned: none unwinds
// into Rust.
template <typename R, typename F>
R guarded(char** err, R failed, F&& body) {
  try {
    return body();
  } catch (const c10::Error& e) {
    set_error(err, e.what_without_backtrace());
  } catch (const std::exception& e) {
    set_error(err, e.what());
  } catch (...) {
    set_error(err, "unknown C++ exception");
  }
  return failed;
}

// A number where the schema wants a Tensor: a wrapped-number tensor, as
// PyTorch's argument parser makes for `tensor + 1.0`.
at::Tensor wrapped(const c10::Scalar& s) {
  at::Tensor t = c10::scalar_to_tensor(s);
  t.unsafeGetTensorImpl()->set_wrapped_number(true);
  return t;
}

c10::IValue to_ivalue(const tk_arg& a, const c10::Argument& arg) {
  switch (a.kind) {
    case TK_DEFAULT:
      if (!arg.default_value().has_value()) {
        throw std::runtime_error("argument '" + arg.name() + "' has no default value");
      }
      return *arg.default_value();
    case TK_NONE:
      return c10::IValue();
    case TK_TENSOR:
      return c10::IValue(*static_cast<const at::Tensor*>(a.p));
    case TK_TENSOR_LIST: {
      c10::List<at::Tensor> list;
      list.reserve(a.n);
      auto ts = static_cast<const at::Tensor* const*>(a.p);
      for (size_t k = 0; k < a.n; ++k) list.push_back(*ts[k]);
      return c10::IValue(list);
    }
    case TK_OPT_TENSOR_LIST: {
      c10::List<std::optional<at::Tensor>> list;
      list.reserve(a.n);
      auto ts = static_cast<const at::Tensor* const*>(a.p);
      for (size_t k = 0; k < a.n; ++k) {
        if (ts[k] == nullptr) {
          list.push_back(std::nullopt);
        } else {
          list.push_back(*ts[k]);
        }
      }
      return c10::IValue(list);
    }
    case TK_INT:
      return c10::IValue(a.i);
    case TK_FLOAT:
      return c10::IValue(a.f);
    case TK_BOOL:
      return c10::IValue(a.i != 0);
    case TK_INT_LIST: {
      auto v = static_cast<const int64_t*>(a.p);
      return c10::IValue(std::vector<int64_t>(v, v + a.n));
    }
    case TK_FLOAT_LIST: {
      auto v = static_cast<const double*>(a.p);
      return c10::IValue(std::vector<double>(v, v + a.n));
    }
    case TK_BOOL_LIST: {
      c10::List<bool> list;
      auto v = static_cast<const uint8_t*>(a.p);
      for (size_t k = 0; k < a.n; ++k) list.push_back(v[k] != 0);
      return c10::IValue(list);
    }
    case TK_SCALAR_INT:
      return c10::IValue(c10::Scalar(a.i));
    case TK_SCALAR_FLOAT:
      return c10::IValue(c10::Scalar(a.f));
    case TK_SCALAR_BOOL:
      return c10::IValue(c10::Scalar(a.i != 0));
    case TK_WRAPPED_INT:
      return c10::IValue(wrapped(c10::Scalar(a.i)));
    case TK_WRAPPED_FLOAT:
      return c10::IValue(wrapped(c10::Scalar(a.f)));
    case TK_WRAPPED_BOOL:
      return c10::IValue(wrapped(c10::Scalar(a.i != 0)));
    case TK_STRING:
      return c10::IValue(std::string(static_cast<const char*>(a.p), a.n));
    case TK_DTYPE:
      return c10::IValue(static_cast<c10::ScalarType>(a.i));
    case TK_MEMORY_FORMAT:
      return c10::IValue(static_cast<c10::MemoryFormat>(a.i));
    case TK_LAYOUT:
      return c10::IValue(static_cast<c10::Layout>(a.i));
    case TK_DEVICE:
      return c10::IValue(c10::Device(static_cast<c10::DeviceType>(a.i),
                                     static_cast<c10::DeviceIndex>(a.j)));
    default:
      throw std::runtime_error("argument '" + arg.name() + "': unknown value kind " +
                               std::to_string(a.kind));
  }
}

// "base|optional|list|element_optional", base one of Tensor int float bool
// Scalar ScalarType MemoryFormat Layout Device str Generator, or the type's
// own name for anything else.
std::string type_code(const c10::TypePtr& t0) {
  c10::TypePtr t = t0;
  bool opt = false, list = false, elem_opt = false;
  if (auto o = t->cast<c10::OptionalType>()) {
    t = o->getElementType();
    opt = true;
  }
  if (auto l = t->cast<c10::ListType>()) {
    t = l->getElementType();
    list = true;
    if (auto o = t->cast<c10::OptionalType>()) {
      t = o->getElementType();
      elem_opt = true;
    }
  }
  std::string base;
  switch (t->kind()) {
    case c10::TypeKind::TensorType:
      base = "Tensor";
      break;
    case c10::TypeKind::IntType:
    case c10::TypeKind::SymIntType:
      base = "int";
      break;
    case c10::TypeKind::FloatType:
    case c10::TypeKind::SymFloatType:
      base = "float";
      break;
    case c10::TypeKind::BoolType:
    case c10::TypeKind::SymBoolType:
      base = "bool";
      break;
    case c10::TypeKind::NumberType:
      base = "Scalar";
      break;
    case c10::TypeKind::ScalarTypeType:
      base = "ScalarType";
      break;
    case c10::TypeKind::MemoryFormatType:
      base = "MemoryFormat";
      break;
    case c10::TypeKind::LayoutType:
      base = "Layout";
      break;
    case c10::TypeKind::DeviceObjType:
      base = "Device";
      break;
    case c10::TypeKind::StringType:
      base = "str";
      break;
    case c10::TypeKind::GeneratorType:
      base = "Generator";
      break;
    default:
      base = t->str();
      for (auto& ch : base) {
        if (ch == '|' || ch == '\n' || ch == '\t') ch = ' ';
      }
  }
  std::ostringstream s;
  s << base << '|' << opt << '|' << list << '|' << elem_opt;
  return s.str();
}

}  // namespace

extern "C" {

void tk_free_str(char* s) { std::free(s); }

// The operator `name` (e.g. "aten::add") with overload `overload` ("" for the
// default one), or null with *err set.
void* tk_op_find(const char* name, const char* overload, char** err) {
  return guarded<void*>(err, nullptr, [&]() -> void* {
    auto h = c10::Dispatcher::singleton().findSchemaOrThrow(name, overload);
    return new c10::OperatorHandle(h);
  });
}

void tk_op_free(void* op) { delete static_cast<c10::OperatorHandle*>(op); }

// The overload names registered for `name`, one per line (the default one is
// an empty line), or null with *err set.
char* tk_overloads(const char* name, char** err) {
  try {
    std::ostringstream s;
    for (const auto& op : c10::Dispatcher::singleton().getAllOpNames()) {
      if (op.name == name) s << op.overload_name << '\n';
    }
    return dup(s.str());
  } catch (const std::exception& e) {
    set_error(err, e.what());
  } catch (...) {
    set_error(err, "unknown C++ exception");
  }
  return nullptr;
}

// The schema: one line per argument,
//   "arg\tNAME\tTYPE\tHAS_DEFAULT\tKWARG_ONLY\tWRITES"
// then one per return, "ret\tTYPE\tWRITES", then "schema\tTEXT".
char* tk_op_schema(void* op, char** err) {
  try {
    const auto& schema = static_cast<c10::OperatorHandle*>(op)->schema();
    std::ostringstream s;
    for (const auto& a : schema.arguments()) {
      bool writes = a.alias_info() != nullptr && a.alias_info()->isWrite();
      s << "arg\t" << a.name() << '\t' << type_code(a.real_type()) << '\t'
        << a.default_value().has_value() << '\t' << a.kwarg_only() << '\t' << writes << '\n';
    }
    for (const auto& r : schema.returns()) {
      bool writes = r.alias_info() != nullptr && r.alias_info()->isWrite();
      s << "ret\t" << type_code(r.real_type()) << '\t' << writes << '\n';
    }
    std::ostringstream text;
    text << schema;
    std::string t = text.str();
    for (auto& ch : t) {
      if (ch == '\n' || ch == '\t') ch = ' ';
    }
    s << "schema\t" << t << '\n';
    return dup(s.str());
  } catch (const std::exception& e) {
    set_error(err, e.what());
  } catch (...) {
    set_error(err, "unknown C++ exception");
  }
  return nullptr;
}

// Calls `op` with `nargs` arguments in schema order. On success returns 0 and
// sets *outs to a malloc'd array of *nouts tensors (null for an undefined or
// None return; tensor lists flattened); the caller owns the tensors and frees
// the array with tk_free_outs. On failure returns 1 with *err set.
int tk_op_call(void* op, const tk_arg* args, size_t nargs, at::Tensor*** outs, size_t* nouts,
               char** err) {
  std::vector<at::Tensor*> result;
  int rc = guarded(err, 1, [&]() {
    auto& handle = *static_cast<c10::OperatorHandle*>(op);
    const auto& schema = handle.schema();
    if (nargs != schema.arguments().size()) {
      throw std::runtime_error("expected " + std::to_string(schema.arguments().size()) +
                               " arguments, got " + std::to_string(nargs));
    }
    torch::jit::Stack stack;
    stack.reserve(nargs);
    for (size_t k = 0; k < nargs; ++k) {
      stack.push_back(to_ivalue(args[k], schema.arguments()[k]));
    }
    handle.callBoxed(&stack);
    for (auto& v : stack) {
      if (v.isTensor()) {
        const at::Tensor& t = v.toTensor();
        result.push_back(t.defined() ? new at::Tensor(t) : nullptr);
      } else if (v.isTensorList()) {
        for (const at::Tensor& t : v.toTensorList().vec()) {
          result.push_back(t.defined() ? new at::Tensor(t) : nullptr);
        }
      } else if (v.isNone()) {
        result.push_back(nullptr);
      } else {
        throw std::runtime_error("returns a " + v.tagKind() + ", not a tensor");
      }
    }
    auto arr = static_cast<at::Tensor**>(std::malloc(sizeof(at::Tensor*) * (result.size() + 1)));
    if (arr == nullptr) throw std::bad_alloc();
    for (size_t k = 0; k < result.size(); ++k) arr[k] = result[k];
    *outs = arr;
    *nouts = result.size();
    return 0;
  });
  if (rc != 0) {
    for (auto t : result) delete t;
  }
  return rc;
}

void tk_free_outs(at::Tensor** outs) { std::free(outs); }

// The caching allocator's statistics of device `index` of type
// `device_type` (1: CUDA): out[0..4] = allocated bytes now, allocated peak,
// reserved bytes now, reserved peak; with `reset`, the peaks are reset
// afterwards. Returns 0, or 1 with *err set (no such allocator, not
// initialized, no such device).
int tk_device_memory(int32_t device_type, int32_t index, int32_t reset, int64_t* out, char** err) {
  return guarded(err, 1, [&]() {
    auto type = static_cast<c10::DeviceType>(device_type);
    c10::DeviceAllocator* alloc = c10::getDeviceAllocator(type);
    if (alloc == nullptr || !alloc->initialized()) {
      throw std::runtime_error("the " + c10::DeviceTypeName(type) + " caching allocator is not initialized");
    }
    auto stats = alloc->getDeviceStats(static_cast<c10::DeviceIndex>(index));
    const auto agg = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    out[0] = stats.allocated_bytes[agg].current;
    out[1] = stats.allocated_bytes[agg].peak;
    out[2] = stats.reserved_bytes[agg].current;
    out[3] = stats.reserved_bytes[agg].peak;
    if (reset != 0) alloc->resetPeakStats(static_cast<c10::DeviceIndex>(index));
    return 0;
  });
}

// Gives the caching allocator's unused cached memory of every device of
// `device_type` back to the driver (torch.cuda.empty_cache). Returns 0, or
// 1 with *err set (no such allocator, not initialized).
int tk_empty_cache(int32_t device_type, char** err) {
  return guarded(err, 1, [&]() {
    auto type = static_cast<c10::DeviceType>(device_type);
    c10::DeviceAllocator* alloc = c10::getDeviceAllocator(type);
    if (alloc == nullptr || !alloc->initialized()) {
      throw std::runtime_error("the " + c10::DeviceTypeName(type) + " caching allocator is not initialized");
    }
    alloc->emptyCache();
    return 0;
  });
}

// cuDNN's deterministic algorithms on (or off): with them, and with its
// autotuner off, the same kernels on the same device give bit-identical
// results run to run (without them, a convolution's backward may sum in any
// order).
void tk_set_deterministic_cudnn(int32_t on) {
  at::globalContext().setDeterministicCuDNN(on != 0);
  at::globalContext().setBenchmarkCuDNN(false);
}

// The caching allocators' settings, in PYTORCH_ALLOC_CONF's syntax (e.g.
// "expandable_segments:True"), as torch.cuda.memory._set_allocator_settings:
// the device parser (CUDA's, when libc10_cuda is loaded) reads them too. 0,
// or 1 with *err set when the string does not parse.
int tk_set_allocator_settings(const char* conf, char** err) {
  return guarded(err, 1, [&]() {
    c10::CachingAllocator::setAllocatorSettings(conf);
    return 0;
  });
}

// How many tensors share the storage of `t` (c10::Storage's use count: one
// per TensorImpl over it, views included). A tensor over memory the caller
// lends (from_blob) must be the only one left before that memory goes.
int64_t tk_storage_use_count(const at::Tensor* t) {
  return static_cast<int64_t>(t->storage().use_count());
}

}  // extern "C"
