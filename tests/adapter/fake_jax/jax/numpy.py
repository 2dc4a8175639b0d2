"""jax.numpy, as far as the test jobs use it: zeros/ones/empty(shape, dtype) on the default device."""
import jax as _jax

_SIZES = {"float32": 4, "float16": 2, "bfloat16": 2, "float64": 8, "int8": 1, "uint8": 1, "int32": 4,
          "int64": 8, "bool": 1}


class dtype(object):
    def __init__(self, name):
        name = getattr(name, "name", name)
        if name not in _SIZES:
            raise TypeError("data type %r not understood" % (name,))
        self.name = name
        self.itemsize = _SIZES[name]

    def __eq__(self, other):
        return isinstance(other, dtype) and other.name == self.name

    def __hash__(self):
        return hash(self.name)

    def __repr__(self):
        return "dtype('%s')" % self.name


float32, float16, bfloat16, int8, int32 = (dtype(n) for n in ("float32", "float16", "bfloat16", "int8", "int32"))


def _shape(shape):
    return (shape,) if isinstance(shape, int) else tuple(shape)


def empty(shape, dtype=float32, device=None):
    return _jax.Array(_shape(shape), dtype, device or _jax.devices()[0])


def zeros(shape, dtype=float32, device=None):
    return empty(shape, dtype, device)


def ones(shape, dtype=float32, device=None):
    return empty(shape, dtype, device)
