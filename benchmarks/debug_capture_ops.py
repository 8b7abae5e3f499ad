"""Which ops give different bits under CUDA-graph capture than eagerly (DiT shapes)?"""
import os
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
import torch
import torch.nn.functional as F
torch.use_deterministic_algorithms(True)
torch.manual_seed(0)
d = "cuda"
q = torch.randn(2, 8, 50, 64, device=d); k = torch.randn(2, 8, 150, 64, device=d); v = torch.randn(2, 8, 150, 64, device=d)
x = torch.randn(2, 50, 512, device=d); w = torch.randn(1536, 512, device=d); b = torch.randn(1536, device=d)
c = torch.randn(2, 1024, 52, device=d); cw = torch.randn(1024, 1024, 3, device=d); cb = torch.randn(1024, device=d)
cases = {
    "sdpa": lambda: F.scaled_dot_product_attention(q, k, v),
    "sdpa_noncontig_q": lambda: F.scaled_dot_product_attention(q.transpose(1, 2).contiguous().transpose(1, 2), k, v),
    "linear": lambda: F.linear(x, w, b),
    "conv1d": lambda: F.conv1d(c, cw, cb),
    "layer_norm": lambda: F.layer_norm(x, (512,)),
}
from torch.nn.attention import sdpa_kernel, SDPBackend
for name, fn in cases.items():
    eager = fn()
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=s):
            out = fn()
    torch.cuda.current_stream().wait_stream(s)
    g.replay(); torch.cuda.synchronize()
    print(f"{name:>18}: replay == eager: {torch.equal(out, eager)}  max|d| {(out - eager).abs().max().item():.3g}")
for be in (SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH):
    try:
        with sdpa_kernel(be):
            r = F.scaled_dot_product_attention(q, k, v)
        print(f"backend {be.name}: equals default eager: {torch.equal(r, cases['sdpa']())}")
    except Exception as e:
        print(f"backend {be.name}: {type(e).__name__}: {str(e)[:100]}")
