import torch
torch.use_deterministic_algorithms(True)
x = torch.randn(1000, device="cuda")
def f(x):
    return x * torch.rand_like(x)
f(x)
s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
pool = torch.cuda.graph_pool_handle()
with torch.random.fork_rng(devices=[torch.device("cuda")]):
    with torch.cuda.stream(s):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=pool, stream=s):
            y = f(x)
        print("captured 1"); f(x); print("eager after capture ok")
        g2 = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g2, pool=pool, stream=s):
            y2 = f(x)
        f(x); print("eager after 2nd capture ok")
torch.manual_seed(0); a = f(x); torch.manual_seed(0); g.replay(); print("replay==eager", torch.equal(a, y))
