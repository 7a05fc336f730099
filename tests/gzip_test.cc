// The one gzip module (src/common/gzip.h): round trips, the output bound, and
// truncated or corrupt input, each a distinct result.
#include "common/gzip.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <random>
#include <string>

namespace {

using spyglass::GunzipResult;
using spyglass::GzipCompress;
using spyglass::GzipDecompress;

std::string Random(size_t n) {
  std::mt19937 rng(7);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng() % 16 + 'a');  // some redundancy, not all
  return s;
}

TEST(Gzip, RoundTrips) {
  for (size_t n : {size_t{0}, size_t{1}, size_t{100000}, size_t{3} << 20}) {
    const std::string in = Random(n);
    const std::string gz = GzipCompress(in, 6);
    EXPECT_TRUE(spyglass::IsGzip(gz));
    std::string out;
    ASSERT_EQ(GzipDecompress(gz, n, &out), GunzipResult::kOk) << n;  // exactly the limit is fine
    EXPECT_EQ(out, in);
  }
}

TEST(Gzip, ReadableByZlibsGzipReader) {
  const std::string in = Random(200000), gz = GzipCompress(in, 1);
  std::string out(in.size() + 1, '\0');
  uLongf len = out.size();
  z_stream z{};
  ASSERT_EQ(inflateInit2(&z, 15 + 16), Z_OK);
  z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(gz.data()));
  z.avail_in = static_cast<uInt>(gz.size());
  z.next_out = reinterpret_cast<Bytef*>(out.data());
  z.avail_out = static_cast<uInt>(len);
  EXPECT_EQ(inflate(&z, Z_FINISH), Z_STREAM_END);
  out.resize(z.total_out);
  inflateEnd(&z);
  EXPECT_EQ(out, in);
}

TEST(Gzip, StopsAtTheLimit) {
  const std::string gz = GzipCompress(std::string(64 << 20, '\0'), 9);  // ~64 KiB: a 1000:1 bomb
  std::string out;
  EXPECT_EQ(GzipDecompress(gz, 1 << 20, &out), GunzipResult::kTooLarge);
  EXPECT_LE(out.capacity(), size_t{1} << 20);  // never held more than the limit
  EXPECT_EQ(GzipDecompress(gz, (64 << 20) - 1, &out), GunzipResult::kTooLarge);
  EXPECT_EQ(GzipDecompress(gz, 64 << 20, &out), GunzipResult::kOk);
}

TEST(Gzip, TruncatedAndCorruptAreTold) {
  const std::string gz = GzipCompress(Random(100000), 6);
  std::string out, detail;
  EXPECT_EQ(GzipDecompress(gz.substr(0, gz.size() / 2), 1 << 20, &out), GunzipResult::kTruncated);
  EXPECT_EQ(GzipDecompress(gz.substr(0, gz.size() - 3), 1 << 20, &out), GunzipResult::kTruncated);  // in the trailer
  std::string bad = gz;
  bad[bad.size() - 6] ^= 0x55;  // the CRC
  EXPECT_EQ(GzipDecompress(bad, 1 << 20, &out, &detail), GunzipResult::kCorrupt);
  EXPECT_NE(detail.find("check"), std::string::npos) << detail;  // zlib: "incorrect data check"
  EXPECT_EQ(GzipDecompress("not gzip at all", 1 << 20, &out, &detail), GunzipResult::kCorrupt);
}

TEST(Gzip, TrailerIsCrcAndLength) {
  const std::string in = Random(1000), gz = GzipCompress(in);
  uint8_t t[8];
  spyglass::GzipTrailer(static_cast<uint32_t>(crc32(0, reinterpret_cast<const Bytef*>(in.data()), in.size())),
                        in.size(), t);
  EXPECT_EQ(gz.substr(gz.size() - 8), std::string(reinterpret_cast<char*>(t), 8));
  EXPECT_EQ(gz.substr(0, 4), std::string(reinterpret_cast<const char*>(spyglass::kGzipHeader), 4));
}

}  // namespace
