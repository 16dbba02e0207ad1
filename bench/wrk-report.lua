-- wrk script: sends Accept-Encoding from the WRK_GZIP environment variable and prints one JSON
-- line with throughput, latency percentiles (microseconds) and errors, for bench/bench.py to parse.
local gzip = os.getenv("WRK_GZIP") == "1"
if gzip then
  wrk.headers["Accept-Encoding"] = "gzip"
end

function done(summary, latency, requests)
  local errors = summary.errors.connect + summary.errors.read + summary.errors.write
    + summary.errors.status + summary.errors.timeout
  io.write(string.format(
    'WRK_JSON {"requests":%d,"duration_us":%d,"bytes":%d,"errors":%d,"timeouts":%d,'
      .. '"p50_us":%d,"p90_us":%d,"p99_us":%d,"max_us":%d,"mean_us":%.1f}\n',
    summary.requests, summary.duration, summary.bytes, errors, summary.errors.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max,
    latency.mean))
end
