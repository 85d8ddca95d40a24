"""Progress: a tqdm bar when asked (TTY), periodic log lines with rate and ETA otherwise."""

from __future__ import annotations

import logging

from components.s3_sync import progress as progress_mod
from components.s3_sync.progress import Progress


def test_log_lines_have_files_bytes_rate_eta(caplog, monkeypatch):
    monkeypatch.setattr(progress_mod, "LOG_EVERY_S", 0.0)
    caplog.set_level(logging.INFO, logger="components.s3_sync")
    bar = Progress(total_files=4, total_bytes=4096, mode=False)
    bar.add_bytes(1024)
    bar.file_done()
    bar.close()
    line = caplog.records[-1].getMessage()
    assert "1/4 files" in line and "1.00kB/4.00kB" in line and "/s" in line and "ETA" in line


def test_tqdm_bar_on_request(capsys):
    bar = Progress(total_files=2, total_bytes=2048, mode=True)
    bar.add_bytes(2048)
    bar.file_done()
    bar.file_done()
    bar.close()
    err = capsys.readouterr().err
    assert "s3-sync" in err and "2/2 files" in err


def test_sync_logs_progress_when_not_a_tty(s3_env, bucket, tmp_path, caplog, monkeypatch):
    from components.s3_sync import sync

    monkeypatch.setattr(progress_mod, "LOG_EVERY_S", 0.0)
    caplog.set_level(logging.INFO, logger="components.s3_sync")
    s3_env.client().put_object(Bucket=bucket, Key="p/a", Body=b"abc")
    sync(f"s3://{bucket}/p", tmp_path, progress=False)
    assert any("1/1 files" in r.getMessage() for r in caplog.records)
    assert not any(s3_env.secret_key in r.getMessage() for r in caplog.records)
