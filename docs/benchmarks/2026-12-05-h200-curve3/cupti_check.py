"""Does torch.profiler read per-kernel DRAM bytes (CUPTI range profiler) on the H200 machine?
Two known kernels: an elementwise x*2 over 32 MiB (reads 32, writes 32) and a 4096^3 bf16 matmul."""
import json

import torch
from torch.profiler import ProfilerActivity, _ExperimentalConfig, profile

x = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
cfg = _ExperimentalConfig(profiler_metrics=["dram__bytes_read.sum", "dram__bytes_write.sum"],
                          profiler_measure_per_kernel=True)
with profile(activities=[ProfilerActivity.CUDA], experimental_config=cfg) as prof:
    y = x * 2
    z = x @ x
    torch.cuda.synchronize()
prof.export_chrome_trace("/tmp/cupti_trace.json")
events = json.load(open("/tmp/cupti_trace.json"))["traceEvents"]
print("events", len(events), "categories", sorted({str(e.get("cat")) for e in events}))
for e in events:
    text = json.dumps(e)
    if e.get("cat") in ("kernel", "cuda_profiler_range") or "dram" in text:
        print(text[:600])
