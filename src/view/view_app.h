// `spyglass view`'s pages: the report page (src/report/web) with the whole
// run coarsened to what a wide screen shows, and view.js, which asks
// /window for what the page's timeline shows as it is zoomed and panned.
#pragma once

#include <string>
#include <string_view>

#include "report/report.h"
#include "view/http_server.h"
#include "view/view_index.h"

namespace spyglass::view {

inline constexpr int kFirstPaintPixels = 4000;
// The report's policy, and fetches from this server.
inline constexpr std::string_view kViewPolicy =
    "default-src 'none'; connect-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:";

// What the server answers while the index is built: "/" a page that shows
// the build's progress (from /progress) and loads the report page once it is
// ready; /progress {"ready": false, "events": N, "read": BYTES, "size": BYTES, "pass": N};
// anything else 503.
HttpResponse IndexingResponse(const HttpRequest& req, const BuildProgress& progress);

class ViewApp {
 public:
  // `index` outlives the app. `page`: the title and what the report page
  // shows besides the timeline (summary, flame graphs, memory timelines,
  // notes), served as `spyglass report` writes them; its timeline is the
  // index's.
  ViewApp(const ViewIndex* index, report::ReportInput page);
  ViewApp(const ViewIndex* index, std::string title) : ViewApp(index, TitleOnly(std::move(title))) {}
  // GET / (the page), /progress ({"ready": true}), /window?t0=NS&t1=NS&px=N (binary: a little-endian
  // uint32 length, that many bytes of JSON {"tracks": [[lane levels]...],
  // "counters": [levels...]} with levels as [threshold_ns, spans, offset,
  // bytes], then the window's blob).
  HttpResponse Handle(const HttpRequest& req) const;

 private:
  static report::ReportInput TitleOnly(std::string title) {
    report::ReportInput in;
    in.title = std::move(title);
    return in;
  }
  const ViewIndex* index_;
  std::string page_;
};

}  // namespace spyglass::view
