"""The process mesh lives in the runtime (runtime/mesh.py): every run places its processes on
one. Kept here under its old name, for the techniques that build on it."""
from ..runtime.mesh import Mesh

__all__ = ["Mesh"]
