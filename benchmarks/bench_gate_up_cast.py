"""Cost of rounding float32 gate/up weights to bf16: two contiguous casts (sep) against writing both into
one [L, 2I, H] tensor (nar: narrow + copy_, what mok.nn.ops did before; cat: torch.cat(out=); view; pair:
mok.fast.cast_pair_bf16, what mok.nn.ops does now). CUDA only.
Usage: python benchmarks/bench_gate_up_cast.py   (results: benchmarks/RESULTS.md, run 5)"""
import torch
import mok.fast
def t(fn, n=20):
    for _ in range(3): fn()
    torch.cuda.synchronize(); s=torch.cuda.Event(enable_timing=True); e=torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(n): fn()
    e.record(); torch.cuda.synchronize(); return s.elapsed_time(e)/n
for L,I,H in ((128,768,2048),(64,1536,4096),(8,14336,4096)):
    g=torch.randn(L,I,H,device="cuda"); u=torch.randn(L,I,H,device="cuda")
    both=torch.empty(L,2*I,H,dtype=torch.bfloat16,device="cuda")
    def sep(): g.to(torch.bfloat16); u.to(torch.bfloat16)
    def nar(): both.narrow(1,0,I).copy_(g); both.narrow(1,I,I).copy_(u)
    def cat(): torch.cat([g,u],1,out=both)
    def view(): b=both.view(L,2,I,H); b[:,0].copy_(g); b[:,1].copy_(u)
    def pair(): mok.fast.cast_pair_bf16(g,u,both)
    print(L,I,H, {k: round(t(f),3) for k,f in dict(sep=sep,nar=nar,cat=cat,view=view,pair=pair).items()}, flush=True)
    ref=torch.cat([g,u],1).bfloat16(); cat(); assert torch.equal(both,ref); nar(); assert torch.equal(both,ref); both.zero_(); pair(); assert torch.equal(both,ref)
