"""FP8 convolutions (``GENAUG_QUANTIZE=fp8-conv``): a UNet's 2-D convolutions as float8
matrix products, beside its linear layers (:mod:`~genaug.service.pipeline.quantize`).

torch has no float8 convolution, and torchao 0.18's is for Blackwell and newer only (its
``mslk`` kernel) and drops the convolution's bias. So genaug lowers a convolution itself: the
input's patches as rows (``F.unfold``; a 1x1 convolution is its pixels), each row quantized to
``float8_e4m3fn`` with its own scale (its largest value over 448, at least
:data:`~genaug.service.pipeline.quantize.FP8_ACTIVATION_LB`: a row of zeros stays zeros), the
weight once with one scale per output channel, and one ``torch._scaled_mm`` with the bias
fused: the FP8 tensor cores' product (compute capability 8.9 on), and on the CPU the same op
(what the CPU tests run). A 3x3 convolution reads its input nine times as patches, so
whether it pays against cuDNN's bf16 convolution on a GPU is what the GPU bench measures
(``quantize=fp8-conv`` rows); 1x1 convolutions are plain matrix products.

Example::

    layer = Fp8Conv2d(unet.down_blocks[1].resnets[0].conv1)   # from a bf16 nn.Conv2d
    y = layer(x)                                              # ~ conv(x), bf16 out
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["E4M3_MAX", "Fp8Conv2d", "fp8_conv_filter"]

#: The largest float8_e4m3fn value.
E4M3_MAX = float(torch.finfo(torch.float8_e4m3fn).max)


def fp8_conv_filter(module: torch.nn.Module, fqn: str, skip: tuple[str, ...] = ()) -> bool:
    """Whether to make ``module`` (named ``fqn``) an :class:`Fp8Conv2d`: a plain 2-D
    convolution (one group, zero padding) whose input and output channels are multiples of 16
    (what the FP8 product requires: SDXL's ``conv_in`` and ``conv_out``, 4 latent channels,
    stay bf16), whose name contains none of ``skip``."""
    if not isinstance(module, torch.nn.Conv2d) or any(part in fqn for part in skip):
        return False
    return (module.groups == 1 and module.padding_mode == "zeros"
            and isinstance(module.padding, tuple)
            and module.in_channels % 16 == 0 and module.out_channels % 16 == 0)


class Fp8Conv2d(torch.nn.Module):
    """``conv`` as a float8 matrix product (module doc); the same call and output shape.

    The weight is stored as ``weight_fp8`` (``[out, in * kh * kw]``, float8) and
    ``weight_scale`` (``[out, 1]``, float32), each kept as the integers of its bits
    (``weight_bits``, ``scale_bits``), so that a ``module.to(dtype)`` of the UNet (which casts
    every floating tensor, float8 included) moves them but never casts them; the bias stays in
    its dtype. ``activation_lb`` is the least row maximum a scale is computed from.
    """

    weight_bits: torch.Tensor
    scale_bits: torch.Tensor

    def __init__(self, conv: torch.nn.Conv2d, *, activation_lb: float = 1e-12) -> None:
        super().__init__()
        weight = conv.weight.detach()
        out = weight.shape[0]
        flat = weight.reshape(out, -1).float()
        scale = flat.abs().amax(dim=1, keepdim=True).clamp(min=activation_lb) / E4M3_MAX
        quantized = (flat / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
        self.register_buffer("weight_bits", quantized.view(torch.uint8))
        self.register_buffer("scale_bits", scale.contiguous().view(torch.int32))
        self.bias = conv.bias
        self.in_channels, self.out_channels = conv.in_channels, conv.out_channels
        self.kernel_size: tuple[int, int] = (int(conv.kernel_size[0]), int(conv.kernel_size[1]))
        self.stride: tuple[int, int] = (int(conv.stride[0]), int(conv.stride[1]))
        self.padding: tuple[int, int] = (int(conv.padding[0]), int(conv.padding[1]))
        self.dilation: tuple[int, int] = (int(conv.dilation[0]), int(conv.dilation[1]))
        self.activation_lb = activation_lb

    @property
    def weight_fp8(self) -> torch.Tensor:
        return self.weight_bits.view(torch.float8_e4m3fn)

    @property
    def weight_scale(self) -> torch.Tensor:
        return self.scale_bits.view(torch.float32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n, c, h, w = x.shape
        kh, kw = self.kernel_size
        if (kh, kw) == (1, 1) and self.stride == (1, 1) and self.padding == (0, 0):
            rows, ho, wo = x.permute(0, 2, 3, 1).reshape(-1, c), h, w
        else:
            (sh, sw), (ph, pw), (dh, dw) = self.stride, self.padding, self.dilation
            ho = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
            wo = (w + 2 * pw - dw * (kw - 1) - 1) // sw + 1
            patches = F.unfold(x, (kh, kw), dilation=self.dilation, padding=self.padding,
                               stride=self.stride)
            rows = patches.transpose(1, 2).reshape(-1, c * kh * kw)
        scale = rows.abs().amax(dim=1, keepdim=True).float().clamp(min=self.activation_lb)
        scale = scale / E4M3_MAX
        quantized = (rows.float() / scale).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
        bias = None if self.bias is None else self.bias.to(x.dtype)
        product = torch._scaled_mm(quantized, self.weight_fp8.t(), scale_a=scale,
                                   scale_b=self.weight_scale.t(), bias=bias, out_dtype=x.dtype)
        return product.reshape(n, ho, wo, self.out_channels).permute(0, 3, 1, 2)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
                f"stride={self.stride}, padding={self.padding}, float8_e4m3fn")
