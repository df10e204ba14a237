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


def test_fsdd_recordings_are_sorted_by_speaker_digit_and_index(tmp_path):
    """Numeric indices (2 before 10), each recording read from its own file."""
    names = ["1_theo_0", "0_theo_10", "0_theo_2", "0_alice_3"]
    for number, name in enumerate(names):
        _write_wav(tmp_path / f"{name}.wav", [number] * (number + 1))
    fsdd = data.load_fsdd(tmp_path)
    assert fsdd["speaker"].tolist() == ["alice", "theo", "theo", "theo"]
    assert fsdd["digit"].tolist() == [0, 0, 0, 1] and fsdd["index"].tolist() == [3, 2, 10, 0]
    assert [len(audio) for audio in fsdd["audio"]] == [4, 3, 2, 1]


def test_concatenated_utterances_are_the_drawn_recordings_in_order():
    """Every utterance is L in [min_digits, max_digits] recordings (each length seen), each cut
    to max_samples_per_digit, labelled with their digits in order."""
    audio = [100.0 * i + np.arange(3 + i, dtype=np.float32) for i in range(10)]
    digits = (3 * np.arange(10)) % 10
    waveforms, labels = data.concatenate_digits(
        audio, digits, 200, seed=0, min_digits=2, max_digits=4, max_samples_per_digit=5
    )
    for waveform, label in zip(waveforms, labels, strict=True):
        start, drawn = 0, []
        while start < len(waveform):
            recording = audio[int(waveform[start] // 100)][:5]
            np.testing.assert_array_equal(waveform[start : start + len(recording)], recording)
            drawn.append(int(waveform[start] // 100))
            start += len(recording)
        assert label.tolist() == digits[drawn].tolist()
    assert sorted({len(label) for label in labels}) == [2, 3, 4]


def test_log_mel_frames_are_hops_of_periodic_hann_windows():
    """An impulse at sample s reaches frame t when 0 < s - t hop < window (the periodic Hann
    window is 0 only at its first sample); the frame count is 1 + (len - window) // hop; the
    features are log power: doubling the signal adds log 4."""
    impulse = np.zeros(1000, np.float32)
    impulse[80 * 3 + 199] = 1.0  # offsets 199, 119, 39 in frames 3, 4, 5
    features = data.log_mel_spectrogram(impulse, floor=1e-12)
    assert features.shape == (11, 40)
    reached = np.flatnonzero(features.max(axis=1) > np.log(1e-12) + 1)
    assert reached.tolist() == [3, 4, 5]
    noise = np.random.default_rng(0).normal(size=1000).astype(np.float32)
    louder = data.log_mel_spectrogram(2 * noise) - data.log_mel_spectrogram(noise)
    np.testing.assert_allclose(louder, np.log(4.0), atol=1e-4)


def test_mel_filters_peak_at_their_htk_centres():
    """Filter i is nonzero only strictly between mel points i and i + 2 (equally spaced on
    m = 2595 log10(1 + f / 700) from 0 Hz to Nyquist) and largest at the bin nearest point i + 1."""
    filters = data.mel_filterbank(10, 256, 8000)
    top = 2595.0 * np.log10(1.0 + 4000.0 / 700.0)
    points = 700.0 * (10.0 ** (np.linspace(0.0, top, 12) / 2595.0) - 1.0)
    bins = np.arange(129) * 8000 / 256
    for i in range(10):
        support = bins[filters[:, i] > 0]
        assert support.min() > points[i] and support.max() < points[i + 2]
        assert np.argmax(filters[:, i]) == np.argmin(np.abs(bins - points[i + 1]))
