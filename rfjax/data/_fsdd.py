"""Free Spoken Digit Dataset (FSDD): loader, digit-string utterances and log-mel features.

FSDD (Jackson et al., CC BY-SA 4.0, https://github.com/Jakobovski/free-spoken-digit-dataset)
holds 3,000 recordings of single spoken digits, 8 kHz mono 16-bit wav, 6 speakers x 10 digits
x 50 repetitions, named ``{digit}_{speaker}_{index}.wav``. Utterances for speech recognition
are made by concatenating recordings of one speaker set (``concatenate_digits``), and
``log_mel_spectrogram`` computes features with a NumPy STFT and triangular mel filterbank.
"""

from __future__ import annotations

import os
import re
import wave
from collections.abc import Sequence

import numpy as np

from rfjax._validation import check_int, check_real

FSDD_SAMPLE_RATE = 8000
FSDD_SOURCE = "https://github.com/Jakobovski/free-spoken-digit-dataset (folder recordings/)"
FSDD_DIR_VARIABLE = "RFJAX_FSDD_DIR"
_NAME = re.compile(r"^(\d)_([A-Za-z]+)_(\d+)\.wav$")


def fsdd_dir() -> str:
    """The default FSDD folder: the environment variable ``RFJAX_FSDD_DIR``, read now.

    Raises:
      FileNotFoundError: if it is not set, saying where to get the recordings.
    """
    location = os.environ.get(FSDD_DIR_VARIABLE)
    if not location:
        raise FileNotFoundError(
            f"where are the FSDD recordings? Pass data_dir, or set the environment variable "
            f"{FSDD_DIR_VARIABLE} to their folder (get them from {FSDD_SOURCE})"
        )
    return location


def _read_wav(path: str) -> np.ndarray:
    """The samples of an 8 kHz mono 16-bit wav file, in [-1, 1); errors name the file."""
    try:
        with wave.open(path, "rb") as handle:
            channels, width = handle.getnchannels(), handle.getsampwidth()
            rate, count = handle.getframerate(), handle.getnframes()
            frames = handle.readframes(count)
    except (wave.Error, EOFError) as err:  # empty, truncated header or not RIFF/WAVE at all
        raise ValueError(f"{path}: not a readable wav file ({err or type(err).__name__})") from err
    if (channels, width, rate) != (1, 2, FSDD_SAMPLE_RATE):
        raise ValueError(
            f"{path}: expected mono 16-bit {FSDD_SAMPLE_RATE} Hz, got {channels} channels, "
            f"{8 * width}-bit, {rate} Hz"
        )
    if len(frames) != count * width:
        raise ValueError(
            f"{path}: truncated wav file: the header promises {count} samples, the file holds "
            f"{len(frames) // width}"
        )
    return np.frombuffer(frames, "<i2").astype(np.float32) / 32768.0


def load_fsdd(data_dir: str | os.PathLike | None = None) -> dict[str, object]:
    """Loads every FSDD recording (Jackson et al., github.com/Jakobovski/free-spoken-digit-dataset).

    Args:
      data_dir: the folder of ``{digit}_{speaker}_{index}.wav`` files (the repository's
        ``recordings/``); default: the environment variable ``RFJAX_FSDD_DIR``, read at call
        time.

    Returns:
      A dict, recordings sorted by (speaker, digit, index): ``"audio"`` a list of float32
      waveforms in [-1, 1) (8 kHz), ``"digit"`` int32 ``(N,)``, ``"speaker"`` str ``(N,)``,
      ``"index"`` int32 ``(N,)``, ``"sample_rate"`` 8000. The full set has N = 3000 and speakers
      george, jackson, lucas, nicolas, theo, yweweler.

    Raises:
      FileNotFoundError: if no folder is given and ``RFJAX_FSDD_DIR`` is not set, or the folder
        is missing or holds no FSDD wav file (the message says where to get them).
      ValueError: if a file is not a readable wav file, is truncated (holds fewer samples than
        its header says) or is not 8 kHz mono 16-bit; the message names the file.
    """
    data_dir = fsdd_dir() if data_dir is None else os.fspath(data_dir)
    names = sorted(os.listdir(data_dir)) if os.path.isdir(data_dir) else []
    parsed = [
        (m.group(2), int(m.group(1)), int(m.group(3)), n) for n in names if (m := _NAME.match(n))
    ]
    if not parsed:
        raise FileNotFoundError(
            f"no FSDD recordings ({{digit}}_{{speaker}}_{{index}}.wav) found in {data_dir!r}. Get "
            f"them from {FSDD_SOURCE} (git clone, then pass the recordings folder as data_dir)"
        )
    parsed.sort()
    return {
        "audio": [_read_wav(os.path.join(data_dir, name)) for *_, name in parsed],
        "digit": np.array([d for _, d, _, _ in parsed], np.int32),
        "speaker": np.array([s for s, _, _, _ in parsed]),
        "index": np.array([i for _, _, i, _ in parsed], np.int32),
        "sample_rate": FSDD_SAMPLE_RATE,
    }


def concatenate_digits(
    audio: Sequence[np.ndarray],
    digits: np.ndarray,
    num_utterances: int,
    *,
    seed: int,
    min_digits: int = 2,
    max_digits: int = 5,
    max_samples_per_digit: int | None = None,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Digit-string utterances: concatenations of ``min_digits``..``max_digits`` recordings.

    Utterance u draws its length L uniformly from [min_digits, max_digits] and L recordings
    uniformly with replacement from ``audio`` by ``np.random.default_rng(seed)`` (deterministic
    given the seed), each cut to its first ``max_samples_per_digit`` samples if given.

    Args:
      audio: the recordings to draw from (e.g. those of the training speakers).
      digits: their digit labels, ``(len(audio),)``.
      num_utterances: how many utterances (>= 1).
      seed: the NumPy seed, an integer >= 0.
      min_digits, max_digits: 1 <= min_digits <= max_digits.
      max_samples_per_digit: optional cap on each recording's length (>= 1).

    Returns:
      ``(waveforms, labels)``: lists of float32 waveforms and int32 digit sequences.
    """
    num_utterances = check_int("num_utterances", num_utterances, minimum=1)
    seed = check_int("seed", seed, minimum=0)
    min_digits = check_int("min_digits", min_digits, minimum=1)
    max_digits = check_int("max_digits", max_digits, minimum=min_digits)
    digits = np.asarray(digits)
    if len(audio) < 1 or digits.shape != (len(audio),):
        raise ValueError(
            f"audio must hold >= 1 recordings and digits one label each; got {len(audio)} "
            f"recordings and digits of shape {digits.shape}"
        )
    cap = (
        None
        if max_samples_per_digit is None
        else check_int("max_samples_per_digit", max_samples_per_digit, minimum=1)
    )
    rng = np.random.default_rng(seed)
    lengths = rng.integers(min_digits, max_digits + 1, size=num_utterances)
    waveforms, labels = [], []
    for length in lengths:
        chosen = rng.integers(0, len(audio), size=length)
        waveforms.append(np.concatenate([audio[i][:cap] for i in chosen]).astype(np.float32))
        labels.append(digits[chosen].astype(np.int32))
    return waveforms, labels


def _hertz_to_mel(frequency):
    return 2595.0 * np.log10(1.0 + np.asarray(frequency) / 700.0)


def _mel_to_hertz(mel):
    return 700.0 * (10.0 ** (np.asarray(mel) / 2595.0) - 1.0)


def mel_filterbank(
    num_mels: int,
    fft_size: int,
    sample_rate: float,
    *,
    low_hz: float = 0.0,
    high_hz: float | None = None,
) -> np.ndarray:
    """Triangular mel filters on the rfft bins (HTK mel scale m = 2595 log10(1 + f / 700)).

    Filter i rises linearly from mel point i to i + 1 and falls to i + 2, for num_mels + 2
    points equally spaced in mel between ``low_hz`` and ``high_hz`` (default Nyquist): a
    triangle of peak 1 at its centre frequency, read at the bins (its largest value there is
    below 1 unless a bin falls on the centre).

    Returns:
      float32 ``(fft_size // 2 + 1, num_mels)``: power spectrum @ filterbank = mel energies.

    Raises:
      ValueError: for bad arguments, and for a filter that covers no bin (its band narrower
        than the bins' spacing, which left a mel channel constant): fewer ``num_mels`` or a
        larger ``fft_size`` then.
    """
    num_mels = check_int("num_mels", num_mels, minimum=1)
    fft_size = check_int("fft_size", fft_size, minimum=2)
    sample_rate = check_real("sample_rate", sample_rate, positive=True)
    high_hz = sample_rate / 2 if high_hz is None else check_real("high_hz", high_hz, positive=True)
    low_hz = check_real("low_hz", low_hz)
    if not 0 <= low_hz < high_hz <= sample_rate / 2:
        raise ValueError(
            f"need 0 <= low_hz < high_hz <= sample_rate / 2, got {low_hz}, {high_hz}, {sample_rate}"
        )
    points = _mel_to_hertz(np.linspace(_hertz_to_mel(low_hz), _hertz_to_mel(high_hz), num_mels + 2))
    bins = np.linspace(0.0, sample_rate / 2, fft_size // 2 + 1)[:, None]
    left, centre, right = points[:-2], points[1:-1], points[2:]
    rising = (bins - left) / (centre - left)
    falling = (right - bins) / (right - centre)
    filters = np.clip(np.minimum(rising, falling), 0.0, None).astype(np.float32)
    empty = np.flatnonzero(filters.max(axis=0) == 0)
    if empty.size:
        raise ValueError(
            f"num_mels = {num_mels} filters on fft_size = {fft_size} at {sample_rate:g} Hz "
            f"leave {empty.size} filter(s) (first {empty[0]}) covering no FFT bin (bands "
            f"narrower than the bins' spacing {sample_rate / fft_size:g} Hz): use fewer "
            f"num_mels or a larger fft_size"
        )
    return filters


def log_mel_spectrogram(
    waveform: np.ndarray,
    *,
    sample_rate: float = FSDD_SAMPLE_RATE,
    window_size: int = 200,
    hop_size: int = 80,
    fft_size: int = 256,
    num_mels: int = 40,
    floor: float = 1e-6,
) -> np.ndarray:
    """log(mel energies + floor) of a waveform: periodic Hann frames, |rfft|^2, mel filters.

    Frame t covers samples [t hop, t hop + window) (the signal is zero-padded to at least one
    window); defaults are 25 ms windows and 10 ms hops at 8 kHz with a 256-point FFT.

    Args:
      waveform: 1-D float signal.
      sample_rate, window_size, hop_size, fft_size (>= window_size), num_mels, floor (> 0).

    Returns:
      float32 ``(1 + max(0, len - window) // hop, num_mels)``.
    """
    waveform = np.asarray(waveform, np.float32)
    if waveform.ndim != 1:
        raise ValueError(f"waveform must be 1-D, got shape {waveform.shape}")
    window_size = check_int("window_size", window_size, minimum=1)
    hop_size = check_int("hop_size", hop_size, minimum=1)
    fft_size = check_int("fft_size", fft_size, minimum=window_size)
    floor = check_real("floor", floor, positive=True)
    if len(waveform) < window_size:
        waveform = np.pad(waveform, (0, window_size - len(waveform)))
    count = 1 + (len(waveform) - window_size) // hop_size
    index = hop_size * np.arange(count)[:, None] + np.arange(window_size)[None, :]
    window = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(window_size) / window_size)
    power = np.abs(np.fft.rfft(waveform[index] * window, n=fft_size, axis=-1)) ** 2
    filters = mel_filterbank(num_mels, fft_size, sample_rate)
    return np.log(power @ filters + floor).astype(np.float32)
