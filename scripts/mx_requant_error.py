"""How much an MXFP8 GEMM loses if each operand row is requantized from its 1x32 E8M0 block scales
to one scale per row (each block shifted down by its row's largest exponent, rounded to E4M3),
which would let a row-scaled FP8 GEMM serve MX operands. CPU, float64 reference.

    python scripts/mx_requant_error.py
"""
import torch

from tilefly import mx

E4M3 = torch.float8_e4m3fn


def requantize_rows(q: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(E4M3 data with one scale per row, the row's biased E8M0 exponent)."""
    e = scales.view(torch.uint8).to(torch.int32)
    emax = e.max(dim=1, keepdim=True).values
    shift = (e - emax).repeat_interleave(32, dim=1).float()
    return (q.float() * torch.exp2(shift)).to(E4M3), emax


def main() -> None:
    torch.manual_seed(0)
    m = n = 256
    k = 4096
    for spread in (0, 8):
        a, b = torch.randn(m, k), torch.randn(n, k)
        if spread:  # block magnitudes spread over 2^-spread .. 2^spread
            a = a * torch.exp2(torch.randint(-spread, spread + 1, (m, k // 32)).float().repeat_interleave(32, 1))
            b = b * torch.exp2(torch.randint(-spread, spread + 1, (n, k // 32)).float().repeat_interleave(32, 1))
        qa, sa = mx.quantize(a, "mxfp8", swizzle="none")
        qb, sb = mx.quantize(b, "mxfp8", swizzle="none")
        ref = mx.dequantize(qa, sa, "mxfp8", swizzle="none").double() @ \
            mx.dequantize(qb, sb, "mxfp8", swizzle="none").double().T
        ra, ea = requantize_rows(qa, sa)
        rb, eb = requantize_rows(qb, sb)
        got = (ra.double() * torch.exp2((ea - 127).double())) @ (rb.double() * torch.exp2((eb - 127).double())).T
        scale = ref.abs().max()
        print(f"block spread 2^+-{spread}: max error {((got - ref).abs().max() / scale):.2e} of max|C|; "
              f"BF16 rounding of C alone {((ref.to(torch.bfloat16).double() - ref).abs().max() / scale):.2e}")


if __name__ == "__main__":
    main()
