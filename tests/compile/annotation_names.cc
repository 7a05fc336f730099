// Compile checks of annotation names (tests/compile/check_annotation_names.sh):
// built once as is (must compile), and once with each -DBAD_* (must not).
#include <string>

#include "spyglass/profiler.h"

namespace prof = spyglass::profiler;

struct Holder {
  const char name[16] = "member";
};

void Good(const std::string& s, const char* p) {
  static const char kStatic[] = "static";
  char buffer[16] = "buffer";  // mutable: copied
  prof::TraceAnnotation a("literal");
  prof::TraceAnnotation b(kStatic);
  prof::TraceAnnotation c(buffer);
  prof::TraceAnnotation d(s);
  prof::TraceAnnotation e(p);
  prof::StepTraceAnnotation f("step", 1);
  prof::StepTraceAnnotation g(buffer, 2);
}

#ifdef BAD_CONST_STACK_ARRAY
void Bad() {
  const char name[] = "on the stack";  // storage reused after return
  prof::TraceAnnotation a(name);
}
#endif

#ifdef BAD_CONST_MEMBER
void Bad(const Holder& h) { prof::TraceAnnotation a(h.name); }
#endif

#ifdef BAD_STEP_CONST_STACK_ARRAY
void Bad() {
  const char name[] = "step on the stack";
  prof::StepTraceAnnotation a(name, 3);
}
#endif
