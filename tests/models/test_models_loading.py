"""Loading and saving weights through from_pretrained / from_checkpoint / save_pretrained (models/io.py, base.py):
sharded directories, memory-mapped tensors taken as parameters, dtypes, atomic saves, and every damaged or
hostile file of the bad-input review (C7, C8, C9, C10, I7, I9, I10, D7) getting an error that names the file."""
import copy
import json
import struct
import warnings

import pytest
import torch
import transformers

from seqmix.kernels.testing import BF16_BUDGET, FP32_BUDGET, assert_close
from seqmix.models import io
from seqmix.models.mamba import MambaConfig, MambaForCausalLM, MambaModel
from seqmix.models.rwkv4 import RwkvConfig, RwkvForCausalLM, RwkvModel
from seqmix.models.rwkv7 import Rwkv7, Rwkv7Config

SMALL = dict(vocab_size=67, hidden_size=16, num_hidden_layers=3, intermediate_size=40)
IDS = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])


def rwkv4(**overrides):
    torch.manual_seed(0)
    return RwkvForCausalLM(RwkvConfig(**(SMALL | overrides))).eval()


def logits(model, ids=IDS):
    with torch.no_grad():
        return model(ids).logits


def assert_same_weights(model, expected):
    got, want = model.state_dict(), expected.state_dict()
    assert got.keys() == want.keys()
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name


# ------------------------------------------------------------------------------------- sharded directories

def test_sharded_safetensors_from_transformers(tmp_path):
    """transformers writes every checkpoint above its shard size as model.safetensors.index.json + shards; each
    shard must be read (reading only the first leaves tensors missing)."""
    peer = transformers.RwkvForCausalLM(transformers.RwkvConfig(**SMALL, context_length=64))
    ours = rwkv4()
    peer.load_state_dict(ours.state_dict())
    peer.save_pretrained(tmp_path, max_shard_size="20KB")
    index = io.read_json(tmp_path / "model.safetensors.index.json")
    assert len(set(index["weight_map"].values())) >= 3
    assert_same_weights(RwkvForCausalLM.from_pretrained(tmp_path), ours)


def as_pytorch_bin(model, directory, **save_kwargs):
    """A model directory whose weights are a torch.save pytorch_model.bin (as older transformers wrote)."""
    model.save_pretrained(directory)
    (directory / "model.safetensors").unlink()
    torch.save(model.state_dict(), directory / "pytorch_model.bin", **save_kwargs)
    return directory / "pytorch_model.bin"


def test_sharded_pytorch_bin(tmp_path):
    """pytorch_model.bin.index.json with torch.save shards (older transformers checkpoints)."""
    ours = rwkv4()
    as_pytorch_bin(ours, tmp_path).unlink()
    names = list(ours.state_dict())
    weight_map = {}
    for n, part in enumerate((names[:7], names[7:20], names[20:])):
        shard = f"pytorch_model-{n + 1:05d}-of-00003.bin"
        torch.save({k: ours.state_dict()[k] for k in part}, tmp_path / shard)
        weight_map |= {k: shard for k in part}
    (tmp_path / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    assert_same_weights(RwkvForCausalLM.from_pretrained(tmp_path), ours)


def write_index(directory, weight_map):
    (directory / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))


@pytest.mark.parametrize("shard", ["../outside.safetensors", "sub/../../outside.safetensors",
                                   "/tmp/outside.safetensors"])
def test_shard_outside_the_directory_is_refused(tmp_path, shard):
    """I9: an index may not send the loader out of the model directory (transformers follows it)."""
    model_dir = tmp_path / "model"
    rwkv4().save_pretrained(model_dir)
    (model_dir / "model.safetensors").rename(tmp_path / "outside.safetensors")
    names = rwkv4().state_dict().keys()
    write_index(model_dir, {k: shard for k in names})
    with pytest.raises(ValueError, match=r"model\.safetensors\.index\.json: shard .* lies outside the model directory"):
        RwkvForCausalLM.from_pretrained(model_dir)


def test_shard_missing_a_listed_tensor_is_named(tmp_path):
    rwkv4().save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").rename(tmp_path / "part-1.safetensors")
    write_index(tmp_path,
                {k: "part-1.safetensors" for k in rwkv4().state_dict()} | {"extra.weight": "part-1.safetensors"})
    with pytest.raises(KeyError, match=r"part-1\.safetensors: missing tensor.*extra\.weight"):
        RwkvForCausalLM.from_pretrained(tmp_path)


def test_index_decides_which_tensors_a_shard_gives(tmp_path):
    """I01: the index is the list of the checkpoint's tensors (transformers reads each tensor from the shard its
    weight_map names). A tensor a shard holds but the index does not list is not loaded: the model then names it
    as missing, rather than taking a tensor the index never promised."""
    model = rwkv4()
    model.save_pretrained(tmp_path)
    (tmp_path / "model.safetensors").rename(tmp_path / "part-1.safetensors")
    listed = [k for k in model.state_dict() if k != "head.weight"]
    write_index(tmp_path, {k: "part-1.safetensors" for k in listed})
    assert sorted(io.load_pretrained_dir(tmp_path)[1]) == sorted(listed)
    with pytest.raises(KeyError, match=r"missing tensor 'head\.weight'"):
        RwkvForCausalLM.from_pretrained(tmp_path)


@pytest.mark.parametrize("safetensors", ["model.safetensors", "model.safetensors.index.json"])
def test_safetensors_preferred_over_pytorch_bin(tmp_path, safetensors):
    """I04: a directory holding both formats (a conversion that kept the old .bin) loads the safetensors, single or
    sharded, as transformers does."""
    wanted, other = rwkv4(), rwkv4(hidden_size=8)
    wanted.save_pretrained(tmp_path)
    if safetensors.endswith("index.json"):
        (tmp_path / "model.safetensors").rename(tmp_path / "model-00001-of-00001.safetensors")
        write_index(tmp_path, {k: "model-00001-of-00001.safetensors" for k in wanted.state_dict()})
    torch.save(other.state_dict(), tmp_path / "pytorch_model.bin")
    assert_same_weights(RwkvForCausalLM.from_pretrained(tmp_path), wanted)


# --------------------------------------------------------- flash-linear-attention's layout at other sizes

# Head size 16 (fla's group-norm eps is head_dim * norm_eps: 16e-5 here, not BlinkDL's 64e-5) and an ffn width
# left to hidden_ratio (fla rounds int(64 * 3.3) = 211 up to a multiple of 32: 224).
FLA_SMALL = dict(vocab_size=53, hidden_size=64, num_hidden_layers=2, head_dim=16, hidden_ratio=3.3,
                 intermediate_size=None, decay_low_rank_dim=8, a_low_rank_dim=8, v_low_rank_dim=4,
                 gate_low_rank_dim=8)


@pytest.fixture(scope="module")
def fla_small(tmp_path_factory):
    """A random fla RWKV7ForCausalLM of FLA_SMALL saved by fla's own save_pretrained, and the model."""
    from helpers import fla_peer
    path = tmp_path_factory.mktemp("fla-small")
    model = fla_peer.make_model(seed=5, **FLA_SMALL)
    model.save_pretrained(path)
    return path, model


def test_fla_ffn_width_from_hidden_ratio(fla_small):
    """F02: config.json with intermediate_size null: the width fla builds, 224, not int(64 * 3.3) = 211."""
    path, fla_model = fla_small
    assert io.read_json(path / "config.json")["intermediate_size"] is None
    ours = Rwkv7.from_pretrained(path)
    assert ours.config.dim_ffn == 224
    assert ours.blocks[0].ffn.key.weight.shape == fla_model.model.layers[0].ffn.key.weight.shape == (224, 64)


def test_fla_head_size_16_gives_fla_logits(fla_small):
    """F01: the group norm's eps follows the head size (16 * norm_eps), as fla's; 64 * norm_eps is 6.5e-4 off."""
    from helpers import fla_peer
    path, fla_model = fla_small
    ours = Rwkv7.from_pretrained(path)
    ids = torch.randint(0, FLA_SMALL["vocab_size"], (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        got, _ = ours(ids, backend="torch")
    assert_close(got, fla_peer.logits(fla_model, ids), FP32_BUDGET, "ours (fla layout, head size 16) vs fla")


# ------------------------------------------------------------------- memory-mapped, built on the meta device

def mapped_file(tensor) -> str | None:
    """The file whose memory mapping holds the tensor's data (from /proc/self/maps), or None."""
    address = tensor.data_ptr()
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split()
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if lo <= address < hi:
                return fields[5] if len(fields) > 5 else None
    return None


@pytest.mark.parametrize("weights", ["model.safetensors", "pytorch_model.bin"])
def test_parameters_are_the_files_pages(tmp_path, weights):
    """In its stored dtype a loaded model holds no copy of its weights: every parameter's data lies in a memory
    mapping of the weight file, and none is left on the meta device; a zip-format .bin loads without the legacy
    warning."""
    ours = rwkv4()
    if weights == "model.safetensors":
        ours.save_pretrained(tmp_path)
    else:
        as_pytorch_bin(ours, tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loaded = RwkvForCausalLM.from_pretrained(tmp_path)
    assert not any(p.is_meta for p in loaded.parameters())
    assert {mapped_file(p) for p in loaded.parameters()} == {str(tmp_path / weights)}
    assert torch.equal(logits(loaded), logits(ours))
    converted = RwkvForCausalLM.from_pretrained(tmp_path, dtype=torch.float64)
    assert {mapped_file(p) for p in converted.parameters()} != {str(tmp_path / weights)}


def test_tied_head_is_the_embedding_after_loading(tmp_path):
    ours = rwkv4(tie_word_embeddings=True)
    ours.save_pretrained(tmp_path)
    loaded = RwkvForCausalLM.from_pretrained(tmp_path)
    assert loaded.head.weight is loaded.rwkv.embeddings.weight
    assert torch.equal(logits(loaded), logits(ours))


@pytest.mark.parametrize("stored,asked,expected", [
    (torch.bfloat16, None, torch.bfloat16), (torch.bfloat16, "auto", torch.bfloat16),
    (torch.float16, "float32", torch.float32), (torch.float32, "bfloat16", torch.bfloat16),
    (torch.float32, torch.float64, torch.float64)])
def test_dtype_as_stored_or_as_asked(tmp_path, stored, asked, expected):
    """C8: a dtype name is accepted; None keeps the stored dtype (no fp32 detour). The decays (time_decay,
    time_first) of a model asked for in bf16 stay fp32; stored bf16 and loaded as stored, they stay bf16."""
    ours = rwkv4().to(stored)
    ours.save_pretrained(tmp_path)
    loaded = RwkvForCausalLM.from_pretrained(tmp_path, dtype=asked)
    decays = torch.float32 if asked not in (None, "auto") and expected in (torch.bfloat16, torch.float16) else expected
    assert {p.dtype for n, p in loaded.named_parameters() if not loaded.keeps_fp32(n)} == {expected}
    assert {p.dtype for n, p in loaded.named_parameters() if loaded.keeps_fp32(n)} == {decays}
    assert torch.equal(loaded.head.weight, ours.head.weight.to(expected))


@pytest.mark.parametrize("dtype", ["float17", torch.int32, "cuda", 3])
def test_bad_dtype_is_named(tmp_path, dtype):
    rwkv4().save_pretrained(tmp_path)
    with pytest.raises(TypeError, match="dtype must be None"):
        RwkvForCausalLM.from_pretrained(tmp_path, dtype=dtype)


def test_mamba_and_rwkv7_build_on_meta_too(tmp_path):
    torch.manual_seed(1)
    mamba = MambaForCausalLM(MambaConfig(vocab_size=67, hidden_size=16, state_size=4, num_hidden_layers=2)).eval()
    mamba.save_pretrained(tmp_path / "mamba")
    assert torch.equal(logits(MambaForCausalLM.from_pretrained(tmp_path / "mamba")), logits(mamba))
    rwkv7 = Rwkv7(Rwkv7Config(vocab_size=67, n_embd=32, n_layer=2, head_size=16)).eval()
    torch.save(rwkv7.state_dict(), tmp_path / "rwkv7.pth")
    loaded = Rwkv7.from_checkpoint(tmp_path / "rwkv7.pth")
    with torch.no_grad():
        assert torch.equal(loaded(IDS, backend="torch")[0], rwkv7(IDS, backend="torch")[0])


# ------------------------------------------------------------------------------ damaged and hostile files

def test_config_that_is_not_a_json_object_is_named(tmp_path):
    """C7: config.json not JSON, or a JSON list."""
    rwkv4().save_pretrained(tmp_path)
    for text, message in [("{not json", "not valid JSON"), ("[1, 2]", "expected a config object, got a JSON list")]:
        (tmp_path / "config.json").write_text(text)
        with pytest.raises(ValueError, match=rf"config\.json: {message}"):
            RwkvForCausalLM.from_pretrained(tmp_path)


def write_safetensors(path, header, body: bytes):
    text = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(text)) + text + body)


@pytest.mark.parametrize("case", ["header is a list", "tensor info is a string", "overlapping offsets",
                                  "truncated data", "header length too large"])
def test_damaged_safetensors_is_named(tmp_path, case):
    """C7 (a header that is a JSON list or holds a string), I7 (overlapping data_offsets, which the format
    forbids), truncation: a ValueError naming the file."""
    rwkv4().save_pretrained(tmp_path)
    path = tmp_path / "model.safetensors"
    f32 = dict(dtype="F32", shape=[2])
    if case == "header is a list":
        write_safetensors(path, [1, 2], b"")
    elif case == "tensor info is a string":
        write_safetensors(path, {"head.weight": "x"}, b"")
    elif case == "overlapping offsets":
        write_safetensors(path, {"a": f32 | dict(data_offsets=[0, 8]), "b": f32 | dict(data_offsets=[4, 12])},
                          bytes(12))
    elif case == "truncated data":
        path.write_bytes(path.read_bytes()[:-4])
    else:
        path.write_bytes(b"\xff" * 8 + b"{}")
    with pytest.raises(ValueError, match=r"model\.safetensors: not a valid safetensors file"):
        RwkvForCausalLM.from_pretrained(tmp_path)


@pytest.mark.parametrize("damage", ["truncated", "empty", "garbage"])
def test_damaged_torch_checkpoint_is_named(tmp_path, damage):
    """C9: a truncated or empty pytorch_model.bin / .pth gave a raw OSError or EOFError without the file."""
    path = as_pytorch_bin(rwkv4(), tmp_path)
    raw = path.read_bytes()
    damaged = {"truncated": raw[:len(raw) // 2], "empty": b"", "garbage": b"\x80\x02not a pickle"}[damage]
    for name in ("pytorch_model.bin", "model.pth"):
        (tmp_path / name).write_bytes(damaged)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")               # the legacy-format warning, for the non-zip cases
        with pytest.raises(ValueError, match=r"pytorch_model\.bin: "):
            RwkvForCausalLM.from_pretrained(tmp_path)
        with pytest.raises(ValueError, match=r"model\.pth: "):
            Rwkv7.from_checkpoint(tmp_path / "model.pth")


def test_legacy_torch_checkpoint_loads_with_a_warning(tmp_path):
    ours = rwkv4()
    as_pytorch_bin(ours, tmp_path, _use_new_zipfile_serialization=False)
    with pytest.warns(UserWarning, match="legacy .* without mmap"):
        loaded = RwkvForCausalLM.from_pretrained(tmp_path)
    assert torch.equal(logits(loaded), logits(ours))


# ------------------------------------------------------------------------------------------------ configs

@pytest.mark.parametrize("field,value", [("layer_norm_epsilon", "x"), ("layer_norm_epsilon", -1),
                                         ("layer_norm_epsilon", 0), ("layer_norm_epsilon", float("nan")),
                                         ("rescale_every", -2), ("tie_word_embeddings", "yes"),
                                         ("hidden_size", 16.0)])
def test_nonsense_config_is_refused_on_load(tmp_path, field, value):
    """C8 / D7-b: layer_norm_epsilon = -1 loaded and made every logit NaN; a string failed at the first forward."""
    rwkv4().save_pretrained(tmp_path)
    config = io.read_json(tmp_path / "config.json")
    (tmp_path / "config.json").write_text(json.dumps(config | {field: value}))
    with pytest.raises(ValueError, match=f"RwkvConfig.{field} must be"):
        RwkvForCausalLM.from_pretrained(tmp_path)


@pytest.mark.parametrize("make", [lambda: MambaConfig(layer_norm_epsilon=-1), lambda: MambaConfig(use_bias="no"),
                                  lambda: Rwkv7Config(n_embd=-16), lambda: Rwkv7Config(layer_norm_epsilon="x"),
                                  lambda: Rwkv7Config(n_embd=64, head_size=0)])
def test_nonsense_config_is_refused_on_construction(make):
    """C10: Rwkv7Config(n_embd=-16) raised about complex numbers (its LoRA defaults take n_embd ** 0.5)."""
    with pytest.raises(ValueError, match=r"Config\.\w+ must be"):
        make()


# ------------------------------------------------------------------------------------------------- saving

def test_failed_save_leaves_the_old_directory_loadable(tmp_path, monkeypatch):
    """D7: a save that fails while writing the weights (here: a full disk, half the file written) leaves the
    directory holding the old model, intact, and no temporary files."""
    old = rwkv4()
    old.save_pretrained(tmp_path)
    before = sorted(p.name for p in tmp_path.iterdir())

    def fail_half_way(state_dict, path):
        open(path, "wb").write(b"\0" * 100)
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(io, "save_state_dict", fail_half_way)
    with pytest.raises(OSError, match="No space left"):
        rwkv4(hidden_size=8, num_hidden_layers=2).save_pretrained(tmp_path)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert torch.equal(logits(RwkvForCausalLM.from_pretrained(tmp_path)), logits(old))


def test_save_removes_superseded_weight_files(tmp_path):
    """I10: an older pytorch_model.bin (or a sharded set) beside the new model.safetensors is removed; other files
    are kept."""
    old = rwkv4()
    torch.save(old.state_dict(), tmp_path / "pytorch_model.bin")
    (tmp_path / "old-1.safetensors").write_bytes(b"x")
    write_index(tmp_path, {"head.weight": "old-1.safetensors"})
    (tmp_path / "README.md").write_text("mine")
    (tmp_path / "tokenizer.json").write_text("{}")
    new = rwkv4(hidden_size=8)
    new.save_pretrained(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["README.md", "config.json", "model.safetensors",
                                                          "tokenizer.json"]


def test_save_over_the_directory_a_model_was_loaded_from(tmp_path):
    """The loaded model's parameters are views of the old file: replacing it (os.replace) must not change them."""
    first = rwkv4()
    first.save_pretrained(tmp_path)
    loaded = RwkvForCausalLM.from_pretrained(tmp_path)
    expected = logits(loaded)
    rwkv4(hidden_size=8).save_pretrained(tmp_path)
    assert torch.equal(logits(loaded), expected)
    assert RwkvModel.from_pretrained(tmp_path).config.hidden_size == 8


def test_state_round_trip_through_a_file(tmp_path):
    model = rwkv4()
    with torch.no_grad():
        whole = model(IDS).logits
        first = model(IDS[:, :5])
    io.save_state(first.state, tmp_path / "prompt.state")
    with torch.no_grad():
        rest = model(IDS[:, 5:], state=io.load_state(tmp_path / "prompt.state")).logits
    assert_close(rest, whole[:, 5:], FP32_BUDGET, "logits after the state saved to a file")
    (tmp_path / "bad.state").write_bytes(b"junk")
    with pytest.raises(ValueError, match=r"bad\.state: cannot be read as a saved state"):
        io.load_state(tmp_path / "bad.state")


def test_save_keeps_the_file_an_old_index_names(tmp_path):
    """R6: an index whose weight_map names model.safetensors itself made the save delete the weights it had just
    written (only config.json was left). The index goes; the new model.safetensors stays."""
    model = rwkv4()
    model.save_pretrained(tmp_path)
    write_index(tmp_path, {k: "model.safetensors" for k in model.state_dict()})
    RwkvForCausalLM.from_pretrained(tmp_path).save_pretrained(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["config.json", "model.safetensors"]
    assert_same_weights(RwkvForCausalLM.from_pretrained(tmp_path), model)


@pytest.mark.parametrize("num_heads", [None, 0, 5])
def test_fla_head_dim_null_needs_num_heads(fla_small, tmp_path, num_heads):
    """head_dim null with num_heads null / 0 raised TypeError / ZeroDivisionError; 5 does not divide 64."""
    path, _ = fla_small
    config = io.read_json(path / "config.json") | {"head_dim": None, "num_heads": num_heads}
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "model.safetensors").symlink_to(path / "model.safetensors")
    with pytest.raises(ValueError, match=rf"head_dim is null, so num_heads must be a positive int dividing "
                                         rf"hidden_size = 64; got num_heads = {num_heads}"):
        Rwkv7.from_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps(config | {"num_heads": 4}))
    assert Rwkv7.from_pretrained(tmp_path).config.head_size == 16


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool])
def test_integer_weights_are_refused(tmp_path, dtype):
    """An int32 tensor was silently cast to the model's float dtype; no model weight is an integer, so such a
    checkpoint (quantized, or damaged) is refused, naming the tensor."""
    sd = dict(rwkv4().state_dict())
    sd["head.weight"] = sd["head.weight"].to(dtype)
    rwkv4().save_pretrained(tmp_path)
    io.save_state_dict(sd, tmp_path / "model.safetensors")
    with pytest.raises(TypeError, match=rf"'head\.weight' has dtype {dtype}, expected a floating-point dtype"):
        RwkvForCausalLM.from_pretrained(tmp_path)
    with pytest.raises(TypeError, match=r"'head\.weight' has dtype"):
        rwkv4().load_checkpoint(sd)


@pytest.mark.parametrize("ratio,width", [(None, 256), (3.3, 224), ("3.3", None), (0, None)])
def test_fla_hidden_ratio_null_is_fla_default(ratio, width):
    """fla's RWKV7FeedForward takes hidden_ratio null as 4; a ratio that is not a number > 0 is named."""
    from seqmix.models.rwkv7_fla import config_from_fla
    config = dict(model_type="rwkv7", hidden_size=64, head_dim=16, intermediate_size=None, hidden_ratio=ratio)
    if width is None:
        with pytest.raises(ValueError, match=r"intermediate_size is null, so hidden_ratio must be a number > 0"):
            config_from_fla(config)
    else:
        assert config_from_fla(config)["dim_ffn"] == width


# ------------------------------------------------------------ decays kept fp32 beside half-precision weights

# What real checkpoints keep fp32 beside bf16/fp16 weights (transformers' RWKV-4 _keep_in_fp32_modules; Mamba's
# A_log, D and delta's bias, which mamba_ssm and transformers compute with in fp32; RWKV-7's decay w0 and its LoRA
# w1, w2), spelled out here so that the test pins the models' declarations (keep_in_fp32).
KEPT = {"rwkv4": ("time_decay", "time_first"), "mamba": ("A_log", "D", "dt_proj.bias"), "rwkv7": ("w0", "w1", "w2")}
# Every family the loaders handle, each in its own file format: (family, how it is saved and loaded).
LAYOUTS = ["rwkv4 causal lm", "rwkv4 base model", "mamba causal lm", "mamba base model", "rwkv7 pth",
           "rwkv7 safetensors", "rwkv7 fla directory"]


def kept(family: str, name: str) -> bool:
    return any(name == k or name.endswith("." + k) for k in KEPT[family])


def fp32_model(layout: str):
    """A small fp32 model of the layout's family, its initialization spread by noise so that no weight is a
    constant, in eval mode."""
    torch.manual_seed(3)
    family = layout.split()[0]
    if family == "rwkv4":
        model = (RwkvModel if "base" in layout else RwkvForCausalLM)(RwkvConfig(**SMALL))
    elif family == "mamba":
        config = MambaConfig(vocab_size=67, hidden_size=16, state_size=4, num_hidden_layers=2, time_step_rank=3)
        model = (MambaModel if "base" in layout else MambaForCausalLM)(config)
    else:
        # head size 64: BlinkDL's group-norm eps (a .pth does not record it) is fla's head_size * 1e-5
        model = Rwkv7(Rwkv7Config(vocab_size=67, n_embd=64, n_layer=2, head_size=64, decay_lora=8, a_lora=8,
                                  v_lora=8, gate_lora=8))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def as_checkpoint(model, layout: str, half=torch.bfloat16):
    """The model as a real checkpoint stores it: the decays fp32, every other tensor in ``half``."""
    family = layout.split()[0]
    stored = copy.deepcopy(model)
    for name, p in stored.named_parameters():
        p.data = p.data.float() if kept(family, name) else p.data.to(half)
    return stored


def save(model, layout: str, path):
    """Write ``model`` in the layout's format; returns the loader's argument."""
    if layout in ("rwkv7 pth", "rwkv7 safetensors"):
        file = path / ("rwkv7.pth" if layout == "rwkv7 pth" else "rwkv7.safetensors")
        sd = {k: v.contiguous() for k, v in model.state_dict().items()}
        torch.save(sd, file) if layout == "rwkv7 pth" else io.save_state_dict(sd, file)
        return file
    model.save_pretrained(path)
    return path


def load(layout: str, where, dtype=None):
    if layout in ("rwkv7 pth", "rwkv7 safetensors"):
        return Rwkv7.from_checkpoint(where, dtype)
    return type(fp32_model(layout)).from_pretrained(where, dtype)


def forward(model, ids=IDS):
    """Logits (hidden states for a base model) of the torch backend on the CPU."""
    with torch.no_grad():
        out = model(ids, backend="torch")
    if isinstance(out, tuple):
        return out[0]
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def dtypes(model, layout: str) -> tuple[set, set]:
    """(the dtypes of the kept parameters, the dtypes of the others)."""
    family = layout.split()[0]
    named = dict(model.named_parameters())
    return ({p.dtype for n, p in named.items() if kept(family, n)},
            {p.dtype for n, p in named.items() if not kept(family, n)})


@pytest.mark.parametrize("layout", LAYOUTS)
def test_models_declare_the_parameters_they_keep_fp32(layout):
    family = layout.split()[0]
    model = fp32_model(layout)
    assert set(model.keep_in_fp32) == set(KEPT[family])
    names = [n for n, _ in model.named_parameters()]
    assert [n for n in names if model.keeps_fp32(n)] == [n for n in names if kept(family, n)]
    assert all(any(kept(family, n) and n.endswith(k) for n in names) for k in KEPT[family])


@pytest.mark.parametrize("half", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_decays_stored_fp32_load_fp32(tmp_path, layout, half):
    """A checkpoint with fp32 decays beside half-precision weights loads as stored: the decays fp32 (the loaders
    cast every tensor to the majority dtype), the rest in the half dtype, every value exactly the stored one."""
    stored = as_checkpoint(fp32_model(layout), layout, half)
    loaded = load(layout, save(stored, layout, tmp_path))
    assert dtypes(loaded, layout) == ({torch.float32}, {half})
    assert_same_weights(loaded, stored)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_forward_with_fp32_decays_agrees_with_fp32(tmp_path, layout):
    """Each model's forward (torch backend, CPU) runs with fp32 decays beside bf16 weights (RWKV-7's decay LoRA
    w1, w2 met bf16 activations in a matmul: a dtype mismatch), in memory and loaded from its file, and agrees
    with the all-fp32 model of the same (rounded) weights within the bf16 budget."""
    stored = as_checkpoint(fp32_model(layout), layout)
    expected = forward(copy.deepcopy(stored).float())
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8, 2, 8, 1, 8]])
    expected2 = forward(copy.deepcopy(stored).float(), ids)
    loaded = load(layout, save(stored, layout, tmp_path))
    for model in (stored, loaded):
        assert dtypes(model, layout) == ({torch.float32}, {torch.bfloat16})
        assert_close(forward(model).double(), expected.double(), BF16_BUDGET, f"{layout} output")
        assert_close(forward(model, ids).double(), expected2.double(), BF16_BUDGET, f"{layout} output, batch 2")


@pytest.mark.parametrize("layout", ["rwkv4 causal lm", "mamba causal lm", "rwkv7 pth"])
def test_decoding_with_fp32_decays(tmp_path, layout):
    """Token by token (the C step where it runs, backend None) from a checkpoint with fp32 decays beside bf16
    weights: the logits of the all-fp32 model within the bf16 budget, and generate runs."""
    stored = as_checkpoint(fp32_model(layout), layout)
    loaded = load(layout, save(stored, layout, tmp_path))
    expected = forward(copy.deepcopy(stored).float())
    steps, state = [], None
    with torch.no_grad():
        for t in range(IDS.shape[1]):
            out = loaded(IDS[:, t:t + 1], state=state)
            logits, state = out if isinstance(out, tuple) else (out.logits, out.state)
            steps.append(logits)
        tokens, _ = loaded.generate(IDS[:, :3], max_new_tokens=5)
    assert_close(torch.cat(steps, 1).double(), expected.double(), BF16_BUDGET, f"{layout} decoded logits")
    assert tokens.shape == (1, 8)


@pytest.mark.parametrize("asked,half", [("bfloat16", True), (torch.float16, True), ("float32", False),
                                        (torch.float64, False)])
@pytest.mark.parametrize("layout", ["rwkv4 causal lm", "mamba base model", "rwkv7 pth", "rwkv7 fla directory"])
def test_asked_half_dtype_keeps_the_decays_fp32(tmp_path, layout, asked, half):
    """Asked for fp16 or bf16, a model keeps its decays fp32, as the peers build theirs (transformers'
    _keep_in_fp32_modules); asked for fp32 or float64, every parameter takes it. From an fp32 checkpoint and from
    one with fp32 decays beside bf16 weights."""
    want = getattr(torch, asked) if isinstance(asked, str) else asked
    for i, stored in enumerate((fp32_model(layout), as_checkpoint(fp32_model(layout), layout))):
        path = tmp_path / str(i)
        path.mkdir()
        loaded = load(layout, save(stored, layout, path), asked)
        assert dtypes(loaded, layout) == ({torch.float32 if half else want}, {want})
        assert_close(forward(loaded).double(), forward(copy.deepcopy(stored).float()).double(),
                     BF16_BUDGET if half else FP32_BUDGET, f"{layout} output")


def test_majority_dtype_leaves_the_kept_parameters_out():
    """The dtype a checkpoint's model is built in is its weights' majority, the decays not counted: a small
    model's fp32 decays can outnumber its bf16 weights."""
    from seqmix.models.base import resolve_dtype
    sd = {"blocks.0.att.w1": torch.zeros(64, 64), "blocks.0.att.key.weight": torch.zeros(8, 8, dtype=torch.bfloat16)}
    assert resolve_dtype(None, sd) == torch.float32
    assert resolve_dtype(None, sd, Rwkv7.keep_in_fp32) == torch.bfloat16
    assert resolve_dtype("auto", {"blocks.0.att.w1": torch.zeros(3)}, Rwkv7.keep_in_fp32) == torch.float32
