// A whole session in a GPU test: started with given options, some host work
// run in it, stopped, with what it printed on stderr (the GPU tracer's
// messages on a machine without a GPU).
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "session/session.h"

namespace spyglass::testing {

// The Stop status; `err` gets the session's stderr. A session that does not
// start fails the test.
inline Status RunSessionCapturingStderr(const profiler::ProfileOptions& options, model::Space* space,
                                        session::SessionSummary* summary, std::string* err,
                                        void (*work)() = nullptr) {
  ::testing::internal::CaptureStderr();
  std::unique_ptr<session::Session> s;
  Status created = session::Session::Create(options, "busy", &s);
  if (!created.ok()) {
    *err = ::testing::internal::GetCapturedStderr();
    ADD_FAILURE() << "the session did not start: " << created.message();
    return created;
  }
  if (work != nullptr) work();
  Status stopped = s->Stop(space, summary);
  *err = ::testing::internal::GetCapturedStderr();
  return stopped;
}

}  // namespace spyglass::testing
