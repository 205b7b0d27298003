"""autokernel.recognize: which kernel type (or named group) an aten op is, with the type's shape
read from the profiler's recorded inputs, and the profiler scopes of modules that are a type."""
import autokernel
from autokernel import recognize
from models import llama

def test_classify_op_table():
    c = recognize.classify_op
    assert c("aten::linear", [[4, 8, 16], [32, 16], [32]], []) == ("matmul", "matmul",
                                                                    (32, 32, 16), "",
                                                                    {"bias": True})
    assert c("aten::addmm", [[32], [8, 16], [16, 32]], [])[2] == (8, 32, 16)
    assert c("aten::softmax", [[4, 8, 16], [], []], [None, -1, None])[2] == (32, 16)
    assert c("aten::softmax", [[4, 8, 16], [], []], [None, 1, None])[2] is None
    assert "batched matmul" in c("aten::matmul", [[2, 4, 8], [2, 8, 4]], [])[3]
    sdpa = [[1, 2, 8, 16]] * 3 + [[], [], [], [], []]
    assert c("aten::scaled_dot_product_attention", sdpa,
             [None, None, None, None, 0.0, True, None, False])[1:3] == ("flash_attention",
                                                                        (1, 2, 8, 16))
    # Bidirectional, grouped-query (4 query heads on 2 key/value heads), scaled: the same type.
    gqa = [[1, 4, 8, 16], [1, 2, 8, 16], [1, 2, 8, 16], [], [], [], [], []]
    assert c("aten::scaled_dot_product_attention", gqa,
             [None, None, None, None, 0.0, False, 0.3, True])[1:] == (
        "flash_attention", (1, 4, 8, 16), "", {"causal": False, "kv_groups": 2})
    # A generation step: one query over a longer cache under a mask; transformers' grouped
    # form (2 query heads a KV head folded into the query dim, one mask row) is 4 heads of one.
    step = [[2, 4, 1, 16], [2, 2, 24, 16], [2, 2, 24, 16], [2, 1, 1, 24]]
    folded = [[2, 2, 2, 16], [2, 2, 24, 16], [2, 2, 24, 16], [2, 1, 1, 24]]
    speculative = [[2, 2, 3, 16], [2, 2, 24, 16], [2, 2, 24, 16], [2, 1, 3, 24]]
    for shapes, want in ((step, (2, 4, 2, 1, 24, 16)), (folded, (2, 4, 2, 1, 24, 16)),
                         (speculative, (2, 2, 2, 3, 24, 16))):
        assert c("aten::scaled_dot_product_attention", shapes, [])[1:3] == (
            "decode_attention", want)
    cross = [[1, 2, 8, 16], [1, 2, 5, 16], [1, 2, 5, 16], [], [], [], [], []]
    assert c("aten::scaled_dot_product_attention", cross, [])[2] is None
    assert c("aten::sum", [[4, 8, 16]], [None, [1]])[2:] == ((4, 8), "", {"dim": 1, "inner": 16})
    assert c("aten::sum", [[4, 8, 16]], [None, [-1]])[2:] == ((32, 16), "", {})
    assert c("aten::sum", [[4, 8, 16]], [None, [0, 1]])[2] is None
    assert c("aten::layer_norm", [[4, 8, 16], [], [8, 16], [8, 16]], [None, [8, 16]])[2] == \
        (4, 128)                                                         # several trailing dims
    assert c("aten::add_", [[4], [4]], [])[0] == "elementwise"     # in-place variants too
    assert c("aten::_to_copy", [[4]], [])[0] == "copy/cast"
    assert c("aten::embedding", [[10, 4], [2, 3]], [])[0] == "embedding"
    assert c("mylib::strange_op", [], [])[0] == "other"
    for group, ktype, _ in recognize.OP_TABLE.values():  # one table, valid types only
        assert ktype is None or ktype in autokernel.KERNEL_TYPES


def test_scope_names_round_trip():
    name = recognize.scope_name("RMSNorm", "rmsnorm", (8192, 4096))
    assert name == "autokernel::RMSNorm::rmsnorm::8192x4096"
    assert recognize.parse_scope(name) == ("RMSNorm", "rmsnorm", (8192, 4096), "", {})
    name = recognize.scope_name("Attention", "flash_attention", (2, 4, 8, 16), {"kv_groups": 2})
    assert recognize.parse_scope(name)[2:] == ((2, 4, 8, 16), "", {"kv_groups": 2})
    name = recognize.scope_name("Rotary", "rotary_embedding", None, {},
                                "interleaved pairs: no kernel")
    assert recognize.parse_scope(name)[2:] == (None, "interleaved pairs: no kernel", {})


def test_module_scopes_wrap_typed_modules_and_restore_them():
    cfg = llama.LLaMAConfig(vocab_size=64, max_seq=16, n_layer=1, n_head=2, dim=16, hidden=32)
    model = llama.LLaMA(cfg).eval()
    with recognize.module_scopes(model) as wrapped:
        assert wrapped == 5  # the layer's two norms, the final norm, the SwiGLU, the rotary
        model(*llama.get_inputs(1, 4, config=cfg))
    assert not any("forward" in vars(m) for m in model.modules())
