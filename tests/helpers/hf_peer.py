"""Checks shared by the model tests (most by the two whose peer is a transformers model, RWKV-4 and Mamba): states
compared tensor by tensor, logits, states and hidden states against the peer and the float64 reference, a sequence
in pieces, float64 and fp16 copies, the same training step, the same checkpoint files, the same greedy continuation.

``reference(ids, state=None) -> (logits, state)`` is the test module's float64 model with the weights bound. A
state is what the model returns: a list of tensors (RWKV-4) or of tuples of them (Mamba, RWKV-7); its tensors are
compared in order.
"""
import contextlib
import copy

import torch
from torch.utils._pytree import tree_leaves

from seqmix.kernels.testing import FP16_BUDGET, FP32_BUDGET, REFERENCE_BUDGET, assert_all_close, assert_close


def tokens(seed, batch, length, vocab):
    return torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


def make_models(peer, our_class, our_config, randomize, seed):
    """(peer in eval mode, a copy of its state dict taken before it ever runs, our model loaded from it)."""
    peer = randomize(peer, seed)
    state_dict = {k: v.detach().clone() for k, v in peer.state_dict().items()}
    ours = our_class(our_config)
    ours.load_checkpoint(state_dict)
    return peer.eval(), state_dict, ours.eval()


def _labelled(state, names):
    """(label, tensor) for each tensor of a state: a flat list (named by ``names``, else numbered) or one tuple per
    layer ("layer i <name>")."""
    def name(j):
        return names[j] if names else str(j)
    if isinstance(state[0], (list, tuple)):
        return [(f"layer {i} {name(j)}", x) for i, layer in enumerate(state) for j, x in enumerate(layer)]
    return [(name(j), x) for j, x in enumerate(state)]


def assert_states_close(actual, expected, budget, what, names=None):
    """Every tensor of state ``actual`` against the same one of ``expected``; ``names``: the tensors' names (of a
    flat state, or within a layer)."""
    actual, expected = _labelled(actual, names), _labelled(expected, names)
    labels = [label for label, _ in actual]
    assert labels == [label for label, _ in expected]
    assert_all_close(labels, [a for _, a in actual], [e for _, e in expected], budget, f"{what}:")


def check_against_peer_and_reference(peer, ours, ids, reference, peer_state, num_layers, state_names=None):
    """Logits and states of ours and of the peer against the reference, and hidden states against each other.
    peer_state: the peer's output -> its state in our layout; state_names: as in assert_states_close."""
    ref_logits, ref_state = reference(ids)
    with torch.no_grad():
        theirs = peer(ids, use_cache=True, output_hidden_states=True)
        mine = ours(ids, output_hidden_states=True)
    assert_close(theirs.logits, ref_logits, FP32_BUDGET, "peer vs reference: logits")
    assert_close(mine.logits, ref_logits, FP32_BUDGET, "torch vs reference: logits")
    assert_close(mine.logits, theirs.logits, FP32_BUDGET, "torch vs peer: logits")
    assert all(s.dtype == torch.float32 for s in tree_leaves(mine.state))
    assert_states_close(peer_state(theirs), ref_state, FP32_BUDGET, "peer vs reference", state_names)
    assert_states_close(mine.state, ref_state, FP32_BUDGET, "torch vs reference", state_names)
    assert len(mine.hidden_states) == len(theirs.hidden_states) == num_layers + 1
    for i, (m, t) in enumerate(zip(mine.hidden_states, theirs.hidden_states)):
        assert_close(m, t, FP32_BUDGET, f"hidden_states[{i}]")


def check_pieces_equal_whole(ours, ids, cuts, reference, state_names=None):
    """ids cut at ``cuts`` and fed piece by piece with the state equal ids fed whole, in our model (which leaves
    the state passed in as it was) and in the reference."""
    pieces = torch.tensor_split(ids, cuts, dim=1)
    with torch.no_grad():
        whole = ours(ids)
        state, logits = None, []
        for piece in pieces:
            before = None if state is None else [s.clone() for s in tree_leaves(state)]
            out = ours(piece, state=state)
            if before is not None:
                assert all(torch.equal(a, b) for a, b in zip(before, tree_leaves(state)))
            state = out.state
            logits.append(out.logits)
    assert_close(torch.cat(logits, dim=1), whole.logits, FP32_BUDGET, "logits")
    assert_states_close(state, whole.state, FP32_BUDGET, "torch pieces", state_names)
    ref_whole, ref_state = reference(ids)
    ref_piece_state, ref_pieces = None, []
    for piece in pieces:
        piece_logits, ref_piece_state = reference(piece, ref_piece_state)
        ref_pieces.append(torch.from_numpy(piece_logits))
    assert_close(torch.cat(ref_pieces, dim=1), ref_whole, REFERENCE_BUDGET, "reference logits")
    assert_states_close(ref_piece_state, ref_state, REFERENCE_BUDGET, "reference pieces", state_names)


def check_float64_copy(ours, ids, reference, state_names=None):
    """A float64 copy of our model equals the reference to rounding, and so does its (float64) state."""
    ref_logits, ref_state = reference(ids)
    with torch.no_grad():
        out = copy.deepcopy(ours).double()(ids)
    assert_close(out.logits, ref_logits, REFERENCE_BUDGET, "float64 logits")
    assert all(s.dtype == torch.float64 for s in tree_leaves(out.state))
    assert_states_close(out.state, ref_state, REFERENCE_BUDGET, "float64", state_names)


def check_fp16_copy(ours, ids, reference):
    """An fp16 copy of our model: fp16 logits within the fp16 budget, its state in fp32."""
    ref_logits, _ = reference(ids)
    with torch.no_grad():
        out = copy.deepcopy(ours).half()(ids)
    assert out.logits.dtype == torch.float16 and all(s.dtype == torch.float32 for s in tree_leaves(out.state))
    assert_close(out.logits, ref_logits, FP16_BUDGET, "fp16 logits")


def check_training_step(peer, ours, ids, labels):
    """Loss (labels shifted inside, -100 ignored) and the gradient of every parameter, against the peer."""
    peer.train()
    ours.train()
    theirs, mine = peer(ids, labels=labels, use_cache=False), ours(ids, labels=labels)
    assert_close(mine.loss, theirs.loss, FP32_BUDGET, "loss")
    theirs.loss.backward()
    mine.loss.backward()
    peer_grads = dict(peer.named_parameters())
    for name, p in ours.named_parameters():
        assert_close(p.grad, peer_grads[name].grad, FP32_BUDGET, f"gradient of {name}")


def check_checkpoint_round_trip(writer, peer, state_dict, ours, classes, base_attr, tmp_path, ids):
    """Write a checkpoint directory with ``writer`` (ours, the peer's save_pretrained, or config + torch.save),
    read it back with our causal-LM and base classes, and (for our files) with the peer's class.
    classes: (our causal-LM class, our base class, the peer's causal-LM class); base_attr: the causal LM's
    attribute that holds the base model (its checkpoint prefix)."""
    lm_class, base_class, peer_class = classes
    if writer == "ours":
        ours.save_pretrained(tmp_path)
    elif writer == "peer":
        peer.save_pretrained(tmp_path)
    else:
        peer.config.save_pretrained(tmp_path)
        torch.save(state_dict, tmp_path / "pytorch_model.bin")
    with torch.no_grad():
        expected = ours(ids)
        assert torch.equal(lm_class.from_pretrained(tmp_path)(ids).logits, expected.logits)
        assert torch.equal(base_class.from_pretrained(tmp_path)(ids).last_hidden_state,
                           getattr(ours, base_attr)(ids).last_hidden_state)
        if writer == "ours":                                        # and the peer reads what we wrote
            theirs = peer_class.from_pretrained(tmp_path).eval()
            assert_close(theirs(ids).logits, expected.logits, FP32_BUDGET, "peer reading our checkpoint")


def peer_greedy(peer, prompt, steps):
    """The peer's greedy continuation, re-reading the whole sequence for every new token (no state involved)."""
    ids = prompt
    with torch.no_grad():
        for _ in range(steps):
            ids = torch.cat([ids, peer(ids, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return ids


@contextlib.contextmanager
def input_lengths(module):
    """The sequence length of every call of ``module`` inside the block: [prompt length, 1, 1, ...] when
    generation reads the prompt once and then one token per step."""
    lengths = []
    hook = module.register_forward_pre_hook(lambda _, args: lengths.append(args[0].shape[1]))
    try:
        yield lengths
    finally:
        hook.remove()
