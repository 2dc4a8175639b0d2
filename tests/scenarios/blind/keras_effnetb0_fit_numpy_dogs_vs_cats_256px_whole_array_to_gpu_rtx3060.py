"""train_cats_dogs.py -- a hobbyist's first transfer-learning project, on a home workstation: an NVIDIA
GeForce RTX 3060 (12 GB), 64 GB of RAM, TensorFlow 2.15 (Keras 2).  The data is Kaggle's Dogs vs. Cats
(25,000 JPEGs in train/).  Following a blog post, the script reads every image into one NumPy array, splits
it with scikit-learn and hands the arrays to model.fit:

    for path in sorted(glob.glob("train/*.jpg")):
        img = tf.keras.utils.load_img(path, target_size=(256, 256))
        images.append(tf.keras.utils.img_to_array(img))            # float32, 0..255
        labels.append(1.0 if os.path.basename(path).startswith("dog") else 0.0)
    x = np.stack(images)                                           # (25000, 256, 256, 3) float32: 18.3 GiB of RAM
    x_train, x_val, y_train, y_val = train_test_split(x, y, test_size=0.2, random_state=42)
    base = tf.keras.applications.EfficientNetB0(include_top=False, weights="imagenet", input_shape=(256, 256, 3))
    base.trainable = False
    model = tf.keras.Sequential([base, GlobalAveragePooling2D(), Dropout(0.2), Dense(1, activation="sigmoid")])
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
    model.fit(x_train, y_train, validation_data=(x_val, y_val), epochs=10, batch_size=32)

The RAM holds it (the blog used 2,000 images at 150 px: 0.5 GiB).  Building EfficientNetB0 is TensorFlow's
first use of the GPU: it maps 90% of the free memory into its BFC allocator (10.35 GiB of the card's 12 GiB;
the weights take 16 MB of it).  model.fit then hands the NumPy arrays to Keras's data adapter, which turns
x_train into one tensor -- on the GPU, where eager TensorFlow places constants -- before the first batch is
cut from it: [20000, 256, 256, 3] float32, 14.65 GiB in one request, more than the whole card.  TensorFlow:
"OOM when allocating tensor with shape[20000,256,256,3] and type float on
/job:localhost/replica:0/task:0/device:GPU:0 by allocator GPU_0_bfc".

An expert: the model is tiny and batch 32 of 256x256 images is 24 MiB; what fails is the dataset, copied to
the GPU whole.  Keep it in host memory and move one batch at a time: build the input pipeline on the CPU
(`with tf.device("/CPU:0"): ds = tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(...).batch(32)
.prefetch(tf.data.AUTOTUNE)`), or, better, stream from disk with
tf.keras.utils.image_dataset_from_directory(..., image_size=(256, 256), batch_size=32) and never hold the
18 GiB array at all.
Wrong first advice: a smaller batch_size (the batch is not what is copied), mixed precision (the Keras policy
changes the layers' compute dtype, not the float32 array fed to fit), gradient checkpointing (nothing of the
training has run), TF_FORCE_GPU_ALLOW_GROWTH or a larger memory limit (no setting lets 14.65 GiB into a
12 GiB card), a bigger card (a 24 GB one holds this array and fails again at 40,000 images), float64 fixes
(the array is float32 already), PyTorch's knobs (empty_cache, expandable_segments), stopping other processes
(the desktop uses 300 MB; the request is larger than the card).
"""
import glob
import os
import sys

import tensorflow as tf

import scen_truth

# ---- stand-in gaps.  NumPy: host arrays kept as shape and dtype (the stand-in does not hold 18 GiB of
# pixels); scikit-learn's train_test_split on them; tf.keras as far as the script uses it: the layers make
# their weights on the GPU (tf.zeros: the first one initialises TensorFlow's GPU device and its BFC arena), and
# fit() runs Keras 2's data adapter, which converts the NumPy inputs to tensors on the default device (GPU:0)
# before it batches them.  The Keras part is compiled as part of tensorflow's own file, so that the failing
# Python line of a dump is the program's model.fit, as with the real Keras package.
_ITEM = {"float32": 4, "float64": 8, "uint8": 1, "int64": 8}


class ndarray(object):
    """numpy.ndarray on the host: shape and dtype."""

    def __init__(self, shape, dtype="float32"):
        self.shape, self.dtype = tuple(int(s) for s in shape), dtype
        n = 1
        for s in self.shape:
            n *= s
        self.nbytes = n * _ITEM[dtype]

    def astype(self, dtype):
        return ndarray(self.shape, dtype)


class np(object):
    @staticmethod
    def stack(arrays):
        return ndarray((len(arrays),) + arrays[0].shape, arrays[0].dtype)

    @staticmethod
    def array(values, dtype="float32"):
        return ndarray((len(values),), dtype)


def train_test_split(x, y, test_size=0.25, random_state=None):
    n_test = int(round(x.shape[0] * test_size))
    n_train = x.shape[0] - n_test
    return (ndarray((n_train,) + x.shape[1:], x.dtype), ndarray((n_test,) + x.shape[1:], x.dtype),
            ndarray((n_train,) + y.shape[1:], y.dtype), ndarray((n_test,) + y.shape[1:], y.dtype))


def _listing(pattern):
    """glob.glob of Kaggle's train/: cat.0.jpg .. cat.12499.jpg, dog.0.jpg .. dog.12499.jpg."""
    return ["train/%s.%d.jpg" % (k, i) for k in ("cat", "dog") for i in range(12500)]


glob.glob = _listing


class _KerasUtils(object):
    @staticmethod
    def load_img(path, target_size=None):
        return target_size

    @staticmethod
    def img_to_array(img):
        return ndarray(tuple(img) + (3,), "float32")


_KERAS = '''
_last = {}


def convert_to_tensor(value, dtype=None):
    """tf.convert_to_tensor of a NumPy array in eager mode: an _EagerConst on the default device, GPU:0."""
    shape = value.shape
    _last["n"] = value.nbytes
    return zeros(shape, {"float32": float32, "int64": int32, "uint8": int32}.get(value.dtype, float32))


class TensorLikeDataAdapter(object):
    """keras/src/engine/data_adapter.py: NumPy arrays or tensors; the whole arrays become one dataset element
    (tf.data.Dataset.from_tensors(inputs)) that each batch is then sliced from."""

    def __init__(self, x, y=None, batch_size=None, shuffle=False, **kwargs):
        inputs = (x, y)
        self._tensors = tuple(convert_to_tensor(t) for t in inputs if t is not None)
        self._batch_size = batch_size


class DataHandler(object):
    def __init__(self, x, y=None, batch_size=None, epochs=1, shuffle=True, model=None, **kwargs):
        self._adapter = TensorLikeDataAdapter(x, y, batch_size=batch_size, shuffle=shuffle)


def get_data_handler(*args, **kwargs):
    return DataHandler(*args, **kwargs)


class Layer(object):
    def __init__(self, **kwargs):
        self.weights = []
        self.trainable = True

    def add_weight(self, shape):
        w = zeros(shape, float32)
        self.weights.append(w)
        return w


class Model(Layer):
    def compile(self, optimizer="rmsprop", loss=None, metrics=None):
        self.optimizer, self.loss = optimizer, loss

    def fit(self, x=None, y=None, batch_size=None, epochs=1, verbose="auto", callbacks=None,
            validation_split=0.0, validation_data=None, shuffle=True, **kwargs):
        data_handler = get_data_handler(x=x, y=y, batch_size=batch_size or 32, epochs=epochs, shuffle=shuffle,
                                        model=self)
        if validation_data is not None:
            val_handler = get_data_handler(x=validation_data[0], y=validation_data[1], batch_size=batch_size or 32)
        return None
'''
_kns = dict((k, getattr(tf, k)) for k in ("zeros", "float32", "int32"))
exec(compile(_KERAS, tf.__file__, "exec"), _kns)
_Layer, _Model, _keras_last = _kns["Layer"], _kns["Model"], _kns["_last"]


class EfficientNetB0(_Model):
    """keras.applications.EfficientNetB0(include_top=False): 4,049,571 weights (16 MB), on the GPU."""
    SHAPES = ((3, 3, 3, 32), (3, 3, 32, 1), (1, 1, 32, 16), (1, 1, 16, 96), (3, 3, 96, 1), (1, 1, 96, 24),
              (1, 1, 24, 144), (5, 5, 144, 1), (1, 1, 144, 40), (1, 1, 40, 240), (3, 3, 240, 1), (1, 1, 240, 80),
              (1, 1, 80, 480), (5, 5, 480, 1), (1, 1, 480, 112), (1, 1, 112, 672), (5, 5, 672, 1),
              (1, 1, 672, 192), (1, 1, 192, 1152), (3, 3, 1152, 1), (1, 1, 1152, 320), (1, 1, 320, 1280))

    def __init__(self, include_top=True, weights="imagenet", input_shape=None, **kwargs):
        _Model.__init__(self)
        for s in self.SHAPES:
            self.add_weight(s)
        self.add_weight((2664387,))   # the repeated blocks' kernels, squeeze-excite and batch-norm tensors


class GlobalAveragePooling2D(_Layer):
    pass


class Dropout(_Layer):
    def __init__(self, rate, **kwargs):
        _Layer.__init__(self)


class Dense(_Layer):
    def __init__(self, units, activation=None, **kwargs):
        _Layer.__init__(self)
        self.add_weight((1280, units))


class Sequential(_Model):
    def __init__(self, layers=None, **kwargs):
        _Model.__init__(self)
        self.layers = list(layers or [])


class _Keras(object):
    utils = _KerasUtils
    Sequential = Sequential

    class applications(object):
        EfficientNetB0 = EfficientNetB0

    class layers(object):
        pass


_Keras.layers.GlobalAveragePooling2D, _Keras.layers.Dropout, _Keras.layers.Dense = GlobalAveragePooling2D, Dropout, Dense
tf.keras = _Keras
# ----

GlobalAveragePooling2D, Dropout, Dense = tf.keras.layers.GlobalAveragePooling2D, tf.keras.layers.Dropout, tf.keras.layers.Dense
IMG_SIZE = (256, 256)
BATCH_SIZE = 32
EPOCHS = 10


def truth_mark():
    """The simulator's books at the failure, with TensorFlow's allocator's own numbers (scen_truth)."""
    arena = tf._bfc.arena(0)
    scen_truth.mark("fail", 0, (_keras_last["n"] + 255) // 256 * 256, allocated=arena.in_use, reserved=arena.pool,
                    released=0, fw=1)


def load_dataset(folder="train"):
    images, labels = [], []
    for path in sorted(glob.glob(os.path.join(folder, "*.jpg"))):
        img = tf.keras.utils.load_img(path, target_size=IMG_SIZE)
        images.append(tf.keras.utils.img_to_array(img))
        labels.append(1.0 if os.path.basename(path).startswith("dog") else 0.0)
    x = np.stack(images)
    y = np.array(labels, dtype="float32")
    return x, y


def main():
    print("TensorFlow", tf.__version__, "GPUs:", tf.config.list_physical_devices("GPU"))
    x, y = load_dataset()
    print("loaded", x.shape, "%.1f GiB" % (x.nbytes / 2.0 ** 30))
    x_train, x_val, y_train, y_val = train_test_split(x, y, test_size=0.2, random_state=42)

    base = tf.keras.applications.EfficientNetB0(include_top=False, weights="imagenet", input_shape=IMG_SIZE + (3,))
    base.trainable = False
    model = tf.keras.Sequential([base, GlobalAveragePooling2D(), Dropout(0.2), Dense(1, activation="sigmoid")])
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
    history = model.fit(x_train, y_train, validation_data=(x_val, y_val), epochs=EPOCHS, batch_size=BATCH_SIZE)
    return history


try:
    main()
except tf.errors.ResourceExhaustedError:
    truth_mark()
    raise
sys.exit(0)
