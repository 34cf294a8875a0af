"""The actors of the Ray tier (tests/ray_tier/test_ray_tensor_transport.py): a module the workers
import too (the test puts this folder on their PYTHONPATH)."""
import hashlib
import os

import numpy
import ray

from scad.tensor_transport import ScadTensorTransport


def digest(array):
    return hashlib.sha256(numpy.ascontiguousarray(array).view(numpy.uint8).tobytes()).hexdigest()


def make_array(shape, dtype, seed):
    return numpy.random.default_rng(seed).integers(0, 100, size=shape).astype(dtype)


def define_actors(transport):
    """The actor classes, defined once the transport is registered (Ray hands its registrations to
    the actors it creates)."""

    @ray.remote(enable_tensor_transport=True)
    class Source:
        """Returns tensors through the transport and keeps them (Ray keeps a reference too)."""

        def __init__(self):
            self.kept = []

        @ray.method(tensor_transport=transport)
        def make(self, specs, torch_dtype=None):
            tensors = [make_array(shape, dtype, seed) for shape, dtype, seed in specs]
            if torch_dtype is not None:
                import torch
                tensors = [torch.from_numpy(t).to(getattr(torch, torch_dtype)) for t in tensors]
            self.kept = tensors
            return {"tensors": tensors, "step": 7}  # tensors among other data: only they move out of band

        def pid(self):
            return os.getpid()

        def counters(self):
            return ScadTensorTransport.counters()

        def wait_freed(self):
            """Returns once Ray has freed every object holding the kept tensors."""
            for t in self.kept:
                ray.experimental.wait_tensor_freed(t, timeout=60)
            return ScadTensorTransport.counters()

    @ray.remote(enable_tensor_transport=True)
    class Sink:
        """Takes an object as a task argument: Ray has the transport receive its tensors first."""

        def describe(self, obj):
            tensors = obj["tensors"]
            if tensors and type(tensors[0]).__module__.startswith("torch"):
                import torch
                return {"step": obj["step"], "torch": [str(t.dtype) for t in tensors],
                        "digests": [digest(t.to(torch.float64).numpy()) for t in tensors],
                        "counters": ScadTensorTransport.counters()}
            return {"step": obj["step"], "digests": [digest(t) for t in tensors],
                    "dtypes": [str(t.dtype) for t in tensors], "shapes": [list(t.shape) for t in tensors],
                    "writeable": [bool(t.flags.writeable) for t in tensors], "counters": ScadTensorTransport.counters()}

        def counters(self):
            return ScadTensorTransport.counters()

    return Source, Sink
