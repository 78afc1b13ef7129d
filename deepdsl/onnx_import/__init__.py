"""`deepdsl import`: an ONNX model as readable `.ddsl` text, and its initialisers as deepdsl parameter arrays.

    import_model(path, batch=None, loss=True) -> Imported(text, arrays, network)

The model's one data input becomes `input x : [N, ...]` (a symbolic batch becomes `const N`, `--batch` sets it),
every parameterised node one `layer` line named after the node (sanitised and unique), every other node one
binding, in the graph's order. Where the `.ddsl` language cannot say exactly what an ONNX node computes (an
asymmetric pad, a dilation, a broadcast between two computed tensors, ...), the import is refused with the node,
its op type and the opset: never a silently different network. `onnx` is imported only when a model is read, so
the rest of deepdsl works without it.
"""

from deepdsl.onnx_import.importer import import_model
from deepdsl.onnx_import.reading import MIN_OPSET, ONNX_EXTRA, newest_opset, require_onnx
from deepdsl.onnx_import.rules import SUPPORTED
from deepdsl.onnx_import.writing import Imported

__all__ = ["MIN_OPSET", "ONNX_EXTRA", "SUPPORTED", "Imported", "import_model", "newest_opset", "require_onnx"]
