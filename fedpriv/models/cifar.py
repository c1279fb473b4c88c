"""CIFAR-10 models of the DP-SGD literature, for ``(B, 3, 32, 32)`` inputs.

- :class:`CifarCNN` (``model=cifar_cnn``): the CIFAR-10 tanh CNN of Papernot et al.,
  "Tempered Sigmoid Activations for Deep Learning with Differential Privacy" (AAAI 2021,
  arXiv:2007.14191): three blocks of two 3x3 convolutions (32, 64, 128 channels) and a 2x2 max-pool,
  then a dense layer of 128 and the output layer; 550,570 parameters. Only ``Conv2d``,
  ``Linear`` and parameter-free layers, so DP-SGD's per-sample norms take the fast path.
- :class:`WideResNet` (``model=wrn16_4``): WRN-16-4 (Zagoruyko & Komodakis 2016,
  arXiv:1605.07146) as De et al., "Unlocking High-Accuracy Differentially Private Image
  Classification through Scale" (arXiv:2204.13650, Section 3) train it: GroupNorm (16 groups)
  instead of BatchNorm, weight-standardized convolutions (Qiao et al. 2019, arXiv:1903.10520),
  no dropout; 2,748,890 parameters. GroupNorm and ``WSConv2d`` have fast per-sample rules
  (:mod:`fedpriv.mechanisms.ghost_rules`), so DP-SGD's per-sample norms take the fast path too.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class CifarCNN(nn.Module):
    """Papernot et al. (2021) CIFAR-10 CNN, tanh activations; input ``(B, 3, 32, 32)``."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = 3
        for width in (32, 64, 128):
            layers += [
                nn.Conv2d(channels, width, 3, padding=1),
                nn.Tanh(),
                nn.Conv2d(width, width, 3, padding=1),
                nn.Tanh(),
                nn.MaxPool2d(2, 2),
            ]
            channels = width
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(
            nn.Flatten(), nn.Linear(128 * 4 * 4, 128), nn.Tanh(), nn.Linear(128, num_classes)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.features(x))


class WSConv2d(nn.Conv2d):
    """A convolution whose kernel is standardized per output channel before use:
    ``(w - mean(w)) / sqrt(var(w) + eps)`` over (in channels, kh, kw) (Qiao et al. 2019)."""

    eps = 1e-5

    def standardized_weight(self) -> torch.Tensor:
        """The kernel the layer applies, ``(C_out, C_in/g, k_h, k_w)``."""
        w = self.weight
        mean = w.mean(dim=(1, 2, 3), keepdim=True)
        var = w.var(dim=(1, 2, 3), keepdim=True, unbiased=False)
        return (w - mean) / torch.sqrt(var + self.eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.standardized_weight()
        return self._conv_forward(x, w, self.bias)


class WideBlock(nn.Module):
    """Pre-activation wide residual block: GN-ReLU-conv3x3-GN-ReLU-conv3x3, plus the input
    (through a 1x1 WS convolution when the shape changes)."""

    def __init__(self, cin: int, cout: int, stride: int, groups: int) -> None:
        super().__init__()
        self.norm1 = nn.GroupNorm(min(groups, cin), cin)
        self.conv1 = WSConv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.norm2 = nn.GroupNorm(groups, cout)
        self.conv2 = WSConv2d(cout, cout, 3, padding=1, bias=False)
        self.shortcut: nn.Module | None = None
        if stride != 1 or cin != cout:
            self.shortcut = WSConv2d(cin, cout, 1, stride=stride, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.norm1(x))
        skip = x if self.shortcut is None else self.shortcut(out)
        out = self.conv1(out)
        out = self.conv2(F.relu(self.norm2(out)))
        return out + skip


class WideResNet(nn.Module):
    """WRN-``depth``-``width`` with GroupNorm and weight standardization (De et al. 2022).

    Parameters
    ----------
    depth : int
        6n + 4 (16: two blocks per stage).
    width : int
        Widening factor k (stages of 16k, 32k, 64k channels).
    num_classes : int
        Output logits.
    groups : int
        GroupNorm groups (16 in De et al.).

    Raises
    ------
    ValueError
        If ``depth`` is not 6n + 4 with n >= 1.
    """

    def __init__(
        self, depth: int = 16, width: int = 4, num_classes: int = 10, groups: int = 16
    ) -> None:
        super().__init__()
        if depth < 10 or (depth - 4) % 6:
            raise ValueError(f"depth={depth} must be 6n + 4 with n >= 1")
        n = (depth - 4) // 6
        widths = [16, 16 * width, 32 * width, 64 * width]
        self.stem = WSConv2d(3, widths[0], 3, padding=1, bias=False)
        blocks: list[nn.Module] = []
        for stage in range(3):
            for i in range(n):
                cin = widths[stage] if i == 0 else widths[stage + 1]
                stride = 2 if stage > 0 and i == 0 else 1
                blocks.append(WideBlock(cin, widths[stage + 1], stride, groups))
        self.blocks = nn.Sequential(*blocks)
        self.norm = nn.GroupNorm(groups, widths[3])
        self.head = nn.Linear(widths[3], num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.norm(self.blocks(self.stem(x))))
        return self.head(out.mean(dim=(2, 3)))
