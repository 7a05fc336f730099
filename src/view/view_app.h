// `spyglass view`'s pages: the report page (src/report/web) with the whole
// run coarsened to what a wide screen shows, and view.js, which asks
// /window for what the page's timeline shows as it is zoomed and panned.
#pragma once

#include <string>
#include <string_view>

#include "view/http_server.h"
#include "view/view_index.h"

namespace spyglass::view {

inline constexpr int kFirstPaintPixels = 4000;
// The report's policy, and fetches from this server.
inline constexpr std::string_view kViewPolicy =
    "default-src 'none'; connect-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:";

class ViewApp {
 public:
  // `index` outlives the app.
  ViewApp(const ViewIndex* index, std::string title);
  // GET / (the page), /window?t0=NS&t1=NS&px=N (binary: a little-endian
  // uint32 length, that many bytes of JSON {"tracks": [[lane levels]...],
  // "counters": [levels...]} with levels as [threshold_ns, spans, offset,
  // bytes], then the window's blob).
  HttpResponse Handle(const HttpRequest& req) const;

 private:
  const ViewIndex* index_;
  std::string page_;
};

}  // namespace spyglass::view
