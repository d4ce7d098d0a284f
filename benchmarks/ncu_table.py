"""One line per GEMM launch of an Nsight Compute log (`ncu --section SpeedOfLight --section MemoryWorkloadAnalysis`,
as benchmarks/main_check_run37.sh survey and main_check_run44.sh ncu write it): the launch's kind (by its CUTLASS
type, or for SonicMoE's QuACK kernels by its name), tile (QuACK's: its wgmma shape), duration, DRAM / L2 / SM
throughput (% of peak), L2 hit rate, DRAM bandwidth, SM clock and elapsed cycles (with the clock left free, compare
cycles, not durations, of launches that ran at different clocks).
Usage: python benchmarks/ncu_table.py LOG [LOG ...]"""
import re
import sys

METRICS = (("duration", r"Duration\s+(\S+)\s+([\d.,]+)"), ("dram %", r"DRAM Throughput\s+%\s+([\d.]+)"),
           ("L2 %", r"L2 Cache Throughput\s+%\s+([\d.]+)"), ("SM %", r"Compute \(SM\) Throughput\s+%\s+([\d.]+)"),
           ("L2 hit %", r"L2 Hit Rate\s+%\s+([\d.]+)"), ("dram TB/s", r"Memory Throughput\s+Tbyte/s\s+([\d.]+)"),
           ("SM GHz", r"SM Frequency\s+Ghz\s+([\d.]+)"), ("cycles", r"Elapsed Cycles\s+cycle\s+([\d,]+)"))
QUACK = (("dactGemmDGated", "d_a + SwiGLU bwd + d_w"), ("actGemmGated", "gate/up (gathered) + SwiGLU"),
         ("default_epi", "bf16 out"))


def kind(block: str) -> str:
    """The launch's GEMM, by the mainloop and epilogue types its kernel name carries."""
    if block.startswith("kernel_cutlass_kernel_quackgemm"):
        return next((label for key, label in QUACK if key in block.split("\n", 1)[0]), "quack ?")
    if "GateUpPair" in block:
        return "gate/up + SwiGLU"
    if "SwigluBwd" in block:
        return "d_a + SwiGLU bwd"
    if "KHalves" in block:
        return "d_x"
    return "fp32 out" if "LinearCombination<float" in block else "bf16 out"


def rows(text: str) -> list[list[str]]:
    out = []
    for block in re.split(r"\n  (?=(?:void )?(?:cutlass::)?device_kernel<|kernel_cutlass_kernel_quackgemm)", text)[1:]:
        if block.startswith("kernel_cutlass_kernel_quackgemm"):
            t = re.search(r"ShapeMNK64(\d+)16_", block)
            tile = f"wgmma 64x{t.group(1)}" if t else "?"
        else:
            t = re.search(r"tuple<(?:cute::)?C<(?:\(int\))?(\d+)>, (?:cute::)?C<(?:\(int\))?(\d+)>, "
                          r"(?:cute::)?C<(?:\(int\))?64>>", block)
            tile = f"{t.group(1)}x{t.group(2)}" if t else "?"
        row = [kind(block), tile]
        for _, pattern in METRICS:
            m = re.search(pattern, block)
            row.append("?" if m is None else " ".join(m.groups()[::-1]) if len(m.groups()) == 2 else m.group(1))
        out.append(row)
    return out


def main() -> int:
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    for path in sys.argv[1:]:
        print(f"## {path}\n| launch | tile | " + " | ".join(name for name, _ in METRICS) + " |")
        print("|---" * (2 + len(METRICS)) + "|")
        for row in rows(open(path).read()):
            print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
