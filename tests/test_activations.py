"""course_lib.activations: hooks on Linear inputs, per-channel stats, outlier detection, plots."""
import matplotlib
import numpy as np
import pytest
import torch
import torch.nn as nn

from course_lib import activations as A
from course_lib.model import LlamaModel, ModelConfig

matplotlib.use("Agg")


def test_captures_exactly_the_linear_inputs_and_removes_hooks():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 3))
    x = torch.randn(2, 5, 8)

    class Wrap(nn.Module):          # capture takes ids (B, T); feed a float batch the same way
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, ids):
            return self.net(ids)

    acts = A.capture_linear_inputs(Wrap(), x, batch_size=1)
    assert set(acts) == {"net.0", "net.2"}
    assert torch.equal(acts["net.0"], x.reshape(10, 8))
    assert torch.allclose(acts["net.2"], torch.relu(net[0](x)).reshape(10, 16))
    assert not net[0]._forward_pre_hooks and not net[2]._forward_pre_hooks


def test_llama_capture_shapes_and_name_errors():
    m = LlamaModel(ModelConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                               num_key_value_heads=2, intermediate_size=48)).init_weights().eval()
    ids = torch.randint(0, 256, (3, 10))
    acts = A.capture_linear_inputs(m, ids)
    assert len(acts) == 15                               # 2 x 7 block Linears + lm_head
    assert acts["model.layers.1.mlp.down_proj"].shape == (30, 48)
    assert torch.equal(acts["model.layers.0.self_attn.q_proj"],
                       acts["model.layers.0.self_attn.k_proj"])   # same normed input
    only = A.capture_linear_inputs(m, ids, names=["lm_head"])
    assert list(only) == ["lm_head"]
    with pytest.raises(ValueError, match="no Linear named"):
        A.capture_linear_inputs(m, ids, names=["model.layers.9.mlp"])


def test_stats_and_outlier_detection_find_planted_channels():
    torch.manual_seed(0)
    x = torch.randn(200, 64)
    x[:, [3, 40]] *= 30                                  # two outlier channels
    stats = A.channel_stats({"layer": x})
    s = stats["layer"]
    assert torch.allclose(s["absmax"], x.abs().amax(0))
    assert torch.allclose(s["rms"], x.pow(2).mean(0).sqrt())
    assert A.outlier_channels(s["absmax"], 5.0).tolist() == [3, 40]
    row = A.outlier_table(stats)[0]
    assert row["n_outliers"] == 2 and row["max_over_median"] > 10 and row["channels"] == 64
    with pytest.raises(ValueError, match="positive"):
        A.outlier_channels(s["absmax"], 0)


def test_plots_draw():
    x = torch.randn(50, 16).abs()
    stats = A.channel_stats({"a": x, "b": 2 * x})
    ax = A.plot_channel_max(stats)
    assert len(ax.lines) == 4                            # two curves, two thresholds
    ax2 = A.plot_heatmap(x)
    assert ax2.images[0].get_array().shape == (50, 16)


def test_outlier_channels_refuses_inputs_that_gave_silent_answers():
    with pytest.raises(ValueError, match="1-D"):
        A.outlier_channels(torch.ones(3, 4), 5.0)            # a (tokens, channels) matrix
    with pytest.raises(ValueError, match="1-D"):
        A.outlier_channels(torch.tensor([]), 5.0)
    with pytest.raises(ValueError, match="finite, non-negative"):
        A.outlier_channels(torch.tensor([1.0, float("nan"), 1.0, 50.0]), 5.0)   # gave []
    with pytest.raises(ValueError, match="abs"):
        A.outlier_channels(torch.tensor([1.0, -60.0, 1.0, 50.0]), 5.0)          # signed max
    assert A.outlier_channels(np.array([1.0, 1.0, 1.0, 50.0]), 5.0).tolist() == [3]


def test_capture_and_stats_refuse_bad_input():
    from course_lib.model import LlamaModel, ModelConfig
    m = LlamaModel(ModelConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=4,
                               num_key_value_heads=2, intermediate_size=64)).init_weights(0)
    with pytest.raises(TypeError, match="integer tensor of token ids"):
        A.capture_linear_inputs(m, torch.rand(1, 8))
    with pytest.raises(ValueError, match="empty"):
        A.capture_linear_inputs(m, torch.zeros(1, 0, dtype=torch.long))
    with pytest.raises(ValueError, match="batch_size must be"):
        A.capture_linear_inputs(m, torch.zeros(1, 8, dtype=torch.long), batch_size=0)
    with pytest.raises(ValueError, match="NaN or inf"):
        A.channel_stats({"x": torch.tensor([[1.0, float("nan")]])})
    with pytest.raises(ValueError, match="at least one token"):
        A.channel_stats({"x": torch.zeros(0, 4)})


# ---- bad input: clear errors naming the problem and the expected value (issue 19 item 8) -----
@pytest.mark.parametrize("call, match", [
    (lambda: A.capture_linear_inputs(nn.Sequential(nn.Linear(4, 2)), [1, 2]), "must be a torch tensor"),
    (lambda: A.capture_linear_inputs(nn.Sequential(nn.Linear(4, 2)), torch.zeros(0, 4)),
     "ids is empty"),
    (lambda: A.capture_linear_inputs(nn.Sequential(nn.Linear(4, 2)), torch.ones(2, 4), batch_size=0),
     "batch_size must be a whole number >= 1"),
    (lambda: A.capture_linear_inputs(nn.Sequential(nn.Linear(4, 2)), torch.ones(2, 4),
                                     names=["nope"]), r"no Linear named \['nope'\]"),
    (lambda: A.channel_stats({"a": torch.tensor([[1.0, float("nan")]])}), "NaN or inf"),
    (lambda: A.channel_stats({"a": torch.ones(0, 3)}), "at least one token"),
    (lambda: A.outlier_channels(torch.ones(4), ratio=0), "ratio must be positive"),
    (lambda: A.outlier_channels(torch.tensor([1.0, -2.0])), "did you pass x.amax"),
    (lambda: A.outlier_channels(torch.ones(2, 3)), "non-empty 1-D tensor"),
])
def test_bad_input_is_named(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()
