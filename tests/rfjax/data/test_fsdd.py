"""Tests of ``rfjax.data._fsdd``: the FSDD loader reads good recordings and names bad files.

Loaders given damaged files: every error names the file (and line), nothing is silently short,
wrapped or out of range (issue 19, item 7). Each test failed before its fix.
"""

from __future__ import annotations

import wave

import numpy as np
import pytest

from rfjax import data


def _write_wav(path, samples, *, rate=8000):
    with wave.open(str(path), "wb") as handle:
        handle.setnchannels(1)
        handle.setsampwidth(2)
        handle.setframerate(rate)
        handle.writeframes(np.asarray(samples, "<i2").tobytes())


def test_fsdd_reads_a_good_file_from_the_folder_named_at_call_time(tmp_path, monkeypatch):
    _write_wav(tmp_path / "3_theo_0.wav", [0, 16384, -32768])
    monkeypatch.setenv("RFJAX_FSDD_DIR", str(tmp_path))
    fsdd = data.load_fsdd()
    np.testing.assert_array_equal(fsdd["audio"][0], [0.0, 0.5, -1.0])
    assert fsdd["digit"].tolist() == [3] and fsdd["speaker"].tolist() == ["theo"]


@pytest.mark.parametrize(
    "content",
    [b"", b"RIFF", b"not a wav file at all, just text" * 4],
    ids=["empty", "header", "text"],
)
def test_fsdd_unreadable_wav_names_the_file(tmp_path, content):
    _write_wav(tmp_path / "0_theo_0.wav", [1, 2, 3])
    (tmp_path / "1_theo_0.wav").write_bytes(content)
    with pytest.raises(ValueError, match=r"1_theo_0\.wav: not a readable wav file"):
        data.load_fsdd(tmp_path)


def test_fsdd_truncated_wav_is_an_error_not_a_short_recording(tmp_path):
    path = tmp_path / "2_theo_0.wav"
    _write_wav(path, np.arange(100))
    path.write_bytes(path.read_bytes()[:-50])  # the header still promises 100 samples
    with pytest.raises(ValueError, match=r"2_theo_0\.wav: truncated .* promises 100 samples.* 75"):
        data.load_fsdd(tmp_path)


def test_a_mel_filter_that_covers_no_bin_raises():
    """128 mels on a 256-point FFT at 8 kHz: six low filters fall between bins, all zero (their
    log-mel channels were constant)."""
    assert data.mel_filterbank(80, 256, 8000).max(axis=0).min() > 0
    with pytest.raises(ValueError, match=r"num_mels = 128 .* leave 6 filter\(s\) .* no FFT bin"):
        data.mel_filterbank(128, 256, 8000)


@pytest.mark.parametrize(("seed", "error"), [(-1, ValueError), (1.5, TypeError), (True, TypeError)])
def test_concatenate_digits_names_a_bad_seed(seed, error):
    """NumPy's own errors ("expected non-negative integer", "SeedSequence expects int") did not
    say which argument was wrong, and True was taken as seed 1."""
    audio, digits = [np.zeros(8, np.float32)] * 2, np.array([0, 1])
    with pytest.raises(error, match="seed must be an integer >= 0"):
        data.concatenate_digits(audio, digits, 2, seed=seed)
