// Annotations: TraceAnnotation, StepTraceAnnotation, annotate_function.
//
// Near-free when no session records them (one relaxed load and a branch).
// Events nest, and must end on the thread that began them (the objects are
// scoped; do not move them across threads).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "spyglass/internal/recorder.h"

namespace spyglass::profiler {

// TraceMe levels (ProfileOptions::host_tracer_level).
inline constexpr int kLevelCritical = 1;  // user annotations (default)
inline constexpr int kLevelInfo = 2;      // runtime details
inline constexpr int kLevelVerbose = 3;   // low-level details

class OwnedArg;

// One key=value argument of an annotation. Keys and string values are copied.
class Arg {
 public:
  template <class T, std::enable_if_t<std::is_integral_v<T> && std::is_signed_v<T>, int> = 0>
  Arg(std::string_view key, T v) : key_(key), type_(internal::ArgType::kInt64), bits_(static_cast<uint64_t>(static_cast<int64_t>(v))) {}
  template <class T, std::enable_if_t<std::is_integral_v<T> && std::is_unsigned_v<T> && !std::is_same_v<T, bool>, int> = 0>
  Arg(std::string_view key, T v) : key_(key), type_(internal::ArgType::kUint64), bits_(v) {}
  // Booleans are recorded as 1/0, as TraceMe does.
  Arg(std::string_view key, bool v) : key_(key), type_(internal::ArgType::kInt64), bits_(v ? 1 : 0) {}
  Arg(std::string_view key, double v) : key_(key), type_(internal::ArgType::kDouble) { std::memcpy(&bits_, &v, 8); }
  Arg(std::string_view key, float v) : Arg(key, static_cast<double>(v)) {}
  Arg(std::string_view key, std::string_view v) : key_(key), type_(internal::ArgType::kString), str_(v) {}
  Arg(std::string_view key, const char* v) : Arg(key, std::string_view(v)) {}
  Arg(std::string_view key, const std::string& v) : Arg(key, std::string_view(v)) {}

  void record(uint64_t word) const { internal::add_arg(word, key_, type_, bits_, str_); }

 private:
  std::string_view key_;
  internal::ArgType type_;
  uint64_t bits_ = 0;
  std::string_view str_;
};

using Args = std::initializer_list<Arg>;

// A name with static storage duration: a string literal, or a const char array
// at namespace scope or declared static. Only its pointer is recorded. The
// constructor is consteval, so a const array on the stack or in an object
// (whose storage is reused after the annotation ends) does not compile as a
// StaticName: pass it as std::string_view to have it copied.
class StaticName {
 public:
  template <size_t N>
  consteval StaticName(const char (&name)[N]) : name_(name) {}  // NOLINT: implicit on purpose
  constexpr const char* get() const { return name_; }

 private:
  const char* name_;
};

namespace name_detail {
// Names that are copied when recorded: strings, string views, char pointers
// and mutable char arrays (a buffer the program may overwrite). Arrays of
// const char are left to StaticName.
template <class S, class A = std::remove_reference_t<S>>
inline constexpr bool kCopiedName =
    std::is_convertible_v<S, std::string_view> && !(std::is_array_v<A> && std::is_const_v<std::remove_extent_t<A>>);
}  // namespace name_detail

// Records a named event on the calling thread for its lifetime.
//
//   TraceAnnotation a("load");                       // literal: no copy
//   TraceAnnotation b(name_string);                  // copied name
//   TraceAnnotation c("batch", {{"size", 64}, {"lr", 0.1}, {"kind", "eval"}});
//   TraceAnnotation d([&] { return "layer " + std::to_string(i); });  // lazy name
//
// A string literal (any StaticName) is stored as a pointer; every other name
// is copied, including a char buffer; a const char array that is not static
// does not compile (see StaticName).
class TraceAnnotation {
 public:
  explicit TraceAnnotation(StaticName name, int level = kLevelCritical)
      : word_(internal::begin_static(name.get(), level)) {}

  TraceAnnotation(StaticName name, Args args, int level = kLevelCritical)
      : word_(internal::begin_static(name.get(), level)) {
    if (SPYGLASS_UNLIKELY(word_ != 0)) record(args);
  }

  template <class S, std::enable_if_t<name_detail::kCopiedName<S>, int> = 0>
  explicit TraceAnnotation(S&& name, int level = kLevelCritical)
      : word_(internal::begin_copied(std::string_view(name), level)) {}

  template <class S, std::enable_if_t<name_detail::kCopiedName<S>, int> = 0>
  TraceAnnotation(S&& name, Args args, int level = kLevelCritical)
      : word_(internal::begin_copied(std::string_view(name), level)) {
    if (SPYGLASS_UNLIKELY(word_ != 0)) record(args);
  }

  // Lazy name: `make_name` runs only when a session records this level.
  template <class F, std::enable_if_t<std::is_invocable_v<F&>, int> = 0>
  explicit TraceAnnotation(F&& make_name, int level = kLevelCritical) {
    if (SPYGLASS_UNLIKELY(internal::buffer_for(level) != nullptr)) {
      word_ = internal::begin_copied(std::string_view(make_name()), level);
    }
  }

  ~TraceAnnotation() { internal::end(word_); }

  TraceAnnotation(const TraceAnnotation&) = delete;
  TraceAnnotation& operator=(const TraceAnnotation&) = delete;

  // Adds arguments to the running event (TraceMe::AppendMetadata).
  void set_metadata(Args args) { if (word_ != 0) record(args); }

  void add(const Arg& a) const { if (word_ != 0) a.record(word_); }
  void add(const OwnedArg& a) const;

  // Whether this annotation is being recorded.
  bool recording() const { return word_ != 0; }

  // Whether a session records events of `level` right now.
  static bool is_enabled(int level = kLevelCritical) {
    return static_cast<int>(internal::g_state.session_word.load(std::memory_order_relaxed) & 0xff) >= level;
  }

 protected:
  struct NoBegin {};
  explicit TraceAnnotation(NoBegin) {}
  void record(Args args) const { for (const Arg& a : args) a.record(word_); }
  uint64_t word_ = 0;
};

// Marks one step of a training/serving loop: XProf groups everything under it
// and names the step "<name> <step_num>". Adds the TraceMe stat _r=1 before
// the user's arguments, as jax.profiler.StepTraceAnnotation does.
//
// With a flight recorder whose spyglass_dump_if_step_slower_than_ms is set, a
// step that took longer asks for a dump of the ring when it ends.
class StepTraceAnnotation : public TraceAnnotation {
 public:
  StepTraceAnnotation(StaticName name, int64_t step_num, Args args = {}) : TraceAnnotation(NoBegin{}) {
    word_ = internal::begin_static(name.get(), kLevelCritical);
    if (SPYGLASS_UNLIKELY(word_ != 0)) record_step(step_num, args);
  }
  template <class S, std::enable_if_t<name_detail::kCopiedName<S>, int> = 0>
  StepTraceAnnotation(S&& name, int64_t step_num, Args args = {}) : TraceAnnotation(NoBegin{}) {
    word_ = internal::begin_copied(std::string_view(name), kLevelCritical);
    if (SPYGLASS_UNLIKELY(word_ != 0)) record_step(step_num, args);
  }
  ~StepTraceAnnotation() {
    if (SPYGLASS_UNLIKELY(begin_ticks_ != 0)) end_step();
  }

 private:
  void record_step(int64_t step_num, Args args) {
    Arg("_r", int64_t{1}).record(word_);
    Arg("step_num", step_num).record(word_);
    record(args);
    if (SPYGLASS_UNLIKELY(internal::g_state.slow_step_ticks.load(std::memory_order_relaxed) != 0))
      begin_ticks_ = internal::now_ticks();
  }
  // The step's end is recorded before the dump is asked for, so it is in it.
  void end_step() {
    internal::end(word_);
    word_ = 0;
    uint64_t limit = internal::g_state.slow_step_ticks.load(std::memory_order_relaxed);
    if (limit != 0 && internal::now_ticks() - begin_ticks_ > limit) internal::step_was_slow();
  }
  uint64_t begin_ticks_ = 0;
};

// An argument that owns its key and value, for annotations kept around
// (annotate_function). Same value types as Arg.
class OwnedArg {
 public:
  template <class T>
  OwnedArg(std::string key, T v) : key_(std::move(key)) {
    if constexpr (std::is_convertible_v<T, std::string_view>) {
      str_ = std::string(std::string_view(v));
      is_string_ = true;
    } else {
      value_ = v;
    }
  }
  void record(uint64_t word) const {
    if (is_string_) Arg(key_, std::string_view(str_)).record(word);
    else std::visit([&](auto v) { Arg(key_, v).record(word); }, value_);
  }

 private:
  std::string key_;
  std::variant<int64_t, uint64_t, double, bool> value_;
  std::string str_;
  bool is_string_ = false;
};

// Wraps a callable so that each call runs inside TraceAnnotation(name, args).
//
//   auto step = annotate_function(train_step, "train_step", {{"model", "mlp"}, {"layers", 4}});
//   auto f = SPYGLASS_ANNOTATE_FUNCTION(train_step);  // name = "train_step"
//
// The arguments are the wrapper's, recorded on every call (as in JAX); the
// call's own arguments pass through untouched.
template <class F>
class AnnotatedFunction {
 public:
  AnnotatedFunction(F f, std::string name, std::vector<OwnedArg> args)
      : f_(std::move(f)), name_(std::move(name)), args_(std::move(args)) {}

  template <class... A>
  decltype(auto) operator()(A&&... a) const {
    TraceAnnotation scope{std::string_view(name_)};
    for (const OwnedArg& arg : args_) scope.add(arg);
    return f_(std::forward<A>(a)...);
  }
  const std::string& name() const { return name_; }

 private:
  F f_;
  std::string name_;
  std::vector<OwnedArg> args_;
};

template <class F>
AnnotatedFunction<std::decay_t<F>> annotate_function(F&& f, std::string name, std::vector<OwnedArg> args = {}) {
  return AnnotatedFunction<std::decay_t<F>>(std::forward<F>(f), std::move(name), std::move(args));
}

inline void TraceAnnotation::add(const OwnedArg& a) const { if (word_ != 0) a.record(word_); }

// Name defaults to the function's spelling, as JAX uses __qualname__.
#define SPYGLASS_ANNOTATE_FUNCTION(fn, ...) ::spyglass::profiler::annotate_function(fn, #fn, ##__VA_ARGS__)

}  // namespace spyglass::profiler
