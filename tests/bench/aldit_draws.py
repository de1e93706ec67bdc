"""aldit_draws.py — aldit's per-sample timestep and task draws in Python (src/train/prefetch.c's prefetch_sigma and
prefetch_i2v over src/core/rng.h's splitmix64 streams, keyed by run.seed, the epoch and the sample id), for the
training peer (tests/bench/peer_mmdit.py) and the table's floor (train_table.py): u = 1e-5 + (1 - 2e-5) sigmoid(n),
n ~ N(0, 1) under train.timesteps = logit_normal (else u uniform on (0, 1)), sigma = shift u / (1 + (shift - 1) u); a
video whose store row has SigLIP rows trains as image-to-video with probability train.i2v_share. Plain Python.
"""
import math

MASK64 = (1 << 64) - 1
NOISE_STREAM_TAG = 0x6E6F697365   # src/train/train.c: "noise"
I2V_STREAM_TAG = 0x693276         # src/train/prefetch.c: "i2v"


class Stream:
    """src/core/rng.h: a splitmix64 stream, its uniform and Box-Muller normal draws."""

    def __init__(self, state):
        self.state = state & MASK64

    def next_u64(self):
        self.state = (self.state + 0x9E3779B97F4A7C15) & MASK64
        z = self.state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
        return z ^ (z >> 31)

    def uniform(self):
        return (self.next_u64() >> 11) * 2.0 ** -53

    def normal(self):
        u1, u2 = self.uniform(), self.uniform()
        return math.sqrt(-2.0 * math.log(max(u1, 1e-300))) * math.cos(6.283185307179586 * u2)


def rng_hash(key, counter):
    stream = Stream(key ^ ((counter * 0xD1B54A32D192ED03) & MASK64))
    stream.next_u64()
    return stream.next_u64()


def rng_key(a, b, c):
    return rng_hash(rng_hash(a, b), c)


class AlditDraws:
    """Each sample's sigma and task as aldit's prefetcher draws them (prefetch_sigma, prefetch_i2v)."""

    def __init__(self, deck):
        self.seed = rng_hash(int(deck["run.seed"]), NOISE_STREAM_TAG)
        self.shift = float(deck["train.timestep_shift"])
        self.logit_normal = deck["train.timesteps"] == "logit_normal"
        self.i2v_share = float(deck["train.i2v_share"])

    def sigma(self, epoch, sample_id):
        stream = Stream(rng_key(self.seed, epoch, sample_id))
        if self.logit_normal:
            u = 1e-5 + (1.0 - 2e-5) / (1.0 + math.exp(-stream.normal()))
        else:
            u = ((stream.next_u64() >> 11) + 0.5) * 2.0 ** -53
        return self.shift * u / (1.0 + (self.shift - 1.0) * u)

    def i2v(self, epoch, sample_id, eligible):
        if not eligible or self.i2v_share <= 0.0:
            return False
        stream = Stream(rng_hash(rng_key(self.seed, epoch, sample_id), I2V_STREAM_TAG))
        return stream.uniform() < self.i2v_share
