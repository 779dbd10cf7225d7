"""The local storage tools of ``bookkeeper shell``: lastmark, readjournal, readlog,
localconsistencycheck."""

from __future__ import annotations

from pathlib import Path

import pytest

from bookkeeper_py.admin.cli import main
from bookkeeper_py.storage.entry_log import log_name

from .test_engine import KEY, entry, open_engine


def filled(tmp_path: Path) -> tuple[str, str]:
    engine, durable = open_engine(tmp_path)
    for ledger_id in (1, 2):
        engine.create_ledger(ledger_id, KEY)
        for entry_id in range(5):
            engine.add_entry(ledger_id, entry_id, entry(ledger_id, entry_id), True)
    durable.wait_for(10)
    engine.checkpoint()
    engine.fence(2, True)
    durable.wait_for(11)
    engine.close()
    return str(tmp_path / "journal"), str(tmp_path / "ledgers")


def test_lastmark_readjournal_readlog(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    journal, ledgers = filled(tmp_path)
    main(["shell", "lastmark", "--ledger-dir", ledgers])
    assert "LastLogMark: journal file 0 (0), offset" in capsys.readouterr().out
    main(["shell", "readjournal", "--journal-dir", journal])
    out = capsys.readouterr().out
    assert "ENTRY ledger 1 entry 4" in out and "FENCE ledger 2" in out
    assert "records: ENTRY 10, FENCE 1, MASTER_KEY 2" in out
    main(["shell", "readlog", "--ledger-dir", ledgers, "-l", "0", "--ledgerid", "2"])
    out = capsys.readouterr().out
    assert (
        "ledger 2 entry 3" in out
        and "ledger 1 entry" not in out
        and out.strip().endswith("5 entries")
    )


def test_localconsistencycheck_finds_a_damaged_entry(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, ledgers = filled(tmp_path)
    main(["shell", "localconsistencycheck", "--ledger-dir", ledgers])
    assert "checked 10 entries of 2 ledgers: ok" in capsys.readouterr().out
    path = Path(ledgers) / log_name(0)
    data = bytearray(path.read_bytes())
    data[1024 + 8 + 50] ^= 0x01  # inside the first record's body
    path.write_bytes(bytes(data))
    with pytest.raises(SystemExit) as exited:
        main(["shell", "localconsistencycheck", "--ledger-dir", ledgers])
    assert exited.value.code == 1
    out = capsys.readouterr().out
    assert "PROBLEM: ledger 1 entry 0 (log 0 offset 1024)" in out and "checksum mismatch" in out
    assert "PROBLEMS FOUND" in out


def test_readlogmetadata_and_listfilesondisc(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    journal, ledgers = filled(tmp_path)
    # each record: its 8-byte header (length, checksum) and the entry
    sizes = {ledger_id: 5 * (8 + len(entry(ledger_id, 0))) for ledger_id in (1, 2)}
    for log in ("0", log_name(0), str(Path(ledgers) / log_name(0))):  # hex id or file name
        main(["shell", "readlogmetadata", "--ledger-dir", ledgers, log])
        out = capsys.readouterr().out.splitlines()
        assert out[0] == f"Print entryLogMetadata of entrylog 0 ({log_name(0)})"
        total = sum(sizes.values())
        assert out[1] == f"entryLogId: 0, remaining size: {total}, total size: {total}, usage: 1.0"
        assert out[2:] == [
            f"--------- Lid={ledger_id}, TotalSizeOfEntriesOfLedger={size}  ---------"
            for ledger_id, size in sorted(sizes.items())
        ]
    for bad, wanted in (("7", f"no entry log {log_name(7)}"), ("zz", "neither an entry log id")):
        with pytest.raises(SystemExit) as exited:
            main(["shell", "readlogmetadata", "--ledger-dir", ledgers, bad])
        assert exited.value.code in (1, 2)
        assert wanted in capsys.readouterr().err

    main(["shell", "listfilesondisc", "--journal-dir", journal, "--ledger-dir", ledgers, "-log"])
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "--------- Printing the list of EntryLog/Ledger Files ---------",
        str((Path(ledgers) / log_name(0)).resolve()),
    ]
    main(["shell", "listfilesondisc", "--journal-dir", journal, "--ledger-dir", ledgers])
    out = capsys.readouterr().out
    assert "Journal Files" in out and "Index Files" in out and "data.mdb" in out
    assert str((Path(journal) / "0000000000000000.txn").resolve()) in out
    with pytest.raises(SystemExit) as exited:
        main(["shell", "listfilesondisc", "--journal-dir", ledgers, "--ledger-dir", ledgers])
    assert exited.value.code == 1 and "journal" in capsys.readouterr().err


def test_readlog_filters_by_entry_and_position_and_prints_bytes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, ledgers = filled(tmp_path)
    main(["shell", "readlog", "--ledger-dir", ledgers, "-l", "0"])
    offsets = [
        int(line.split(":")[0].split()[1])
        for line in capsys.readouterr().out.splitlines()
        if line.startswith("offset ")
    ]
    assert len(offsets) == 10 and offsets == sorted(offsets)
    main(
        ["shell", "readlog", "--ledger-dir", ledgers, "-l", "0", "--ledgerid", "2", "-e", "3", "-m"]
    )
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("ledger 2 entry 3 (" + str(len(entry(2, 3))) + " bytes)")
    assert out[-1] == "1 entries" and len(out) == 3  # the record, its bytes, the count
    main(
        [
            "shell",
            "readlog",
            "--ledger-dir",
            ledgers,
            "-l",
            "0",
            "-sp",
            str(offsets[2]),
            "-ep",
            str(offsets[5]),
        ]
    )
    out = capsys.readouterr().out
    assert [f"offset {offset}:" in out for offset in offsets] == [
        False, False, True, True, True, True, False, False, False, False,
    ]  # fmt: skip
    for bad, wanted in ((["-e", "3"], "give --ledgerid too"), (["-sp", "9", "-ep", "2"], "before")):
        with pytest.raises(SystemExit) as exited:
            main(["shell", "readlog", "--ledger-dir", ledgers, "-l", "0", *bad])
        assert exited.value.code == 1 and wanted in capsys.readouterr().err


def test_lastmark_prints_the_mark_of_every_journal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    engine, durable = open_engine(
        tmp_path,
        journal_directory=str(tmp_path / "j0"),
        extra_journal_directories=(str(tmp_path / "j1"),),
    )
    for ledger_id in (1, 2):  # one ledger per journal (ledger id mod 2)
        engine.create_ledger(ledger_id, KEY)
        engine.add_entry(ledger_id, 0, entry(ledger_id, 0), True)
    durable.wait_for(2)
    engine.checkpoint()
    engine.close()
    main(["shell", "lastmark", "--ledger-dir", str(tmp_path / "ledgers")])
    out = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in out] == ["journal 0", "journal 1"]
    assert all("LastLogMark: journal file" in line for line in out)


def test_shell_conf_gives_the_local_commands_their_directories(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    journal, ledgers = filled(tmp_path)
    conf = tmp_path / "bk_server.conf"
    conf.write_text(f"journalDirectories={journal}\nledgerDirectories={ledgers}\n")
    main(["shell", "--conf", str(conf), "lastmark"])
    assert "LastLogMark: journal file 0 (0), offset" in capsys.readouterr().out
    main(["shell", "-conf", str(conf), "listfilesondisc", "-txn"])
    assert "0000000000000000.txn" in capsys.readouterr().out
    main(["shell", "--conf", str(conf), "readjournal", "--summary"])
    assert "records: ENTRY 10" in capsys.readouterr().out
    main(["shell", "--conf", str(conf), "readlog", "-l", "0", "--summary"])
    assert capsys.readouterr().out.strip().endswith("10 entries")
    with pytest.raises(SystemExit) as exited:
        main(["shell", "lastmark"])
    assert exited.value.code == 1
    assert "pass --ledger-dir DIR, or shell --conf" in capsys.readouterr().err


def test_ledger_prints_where_each_entry_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, ledgers = filled(tmp_path)
    main(["shell", "ledger", "--ledger-dir", ledgers, "-id", "2", "-m"])
    out = capsys.readouterr().out.splitlines()
    assert out[:4] == [
        "===== LEDGER: 2 =====",
        f"master key  : {KEY.hex().upper()}",
        "entries      : 5",
        "isFenced     : true",
    ]
    offsets = [
        int(line.split(":")[0].split()[1])
        for line in _readlog(ledgers, capsys)
        if " ledger 2 " in line
    ]
    assert out[5:] == [
        f"entry {entry_id}\t:\t(log: 0, pos: {offset})" for entry_id, offset in enumerate(offsets)
    ]
    main(["shell", "ledger", "--ledger-dir", ledgers, "1"])  # BookKeeper's positional form
    assert capsys.readouterr().out.count("\t(log: 0, pos: ") == 5
    with pytest.raises(SystemExit) as exited:
        main(["shell", "ledger", "--ledger-dir", ledgers, "-id", "9"])
    assert exited.value.code == 1 and "ledger 9 is not in the index" in capsys.readouterr().err


def _readlog(ledgers: str, capsys: pytest.CaptureFixture[str]) -> list[str]:
    main(["shell", "readlog", "--ledger-dir", ledgers, "-l", "0"])
    return [line for line in capsys.readouterr().out.splitlines() if line.startswith("offset ")]


def test_shell_conf_with_several_ledger_directories_asks_which(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    journal, ledgers = filled(tmp_path)
    conf = tmp_path / "bk_server.conf"
    conf.write_text(
        f"journalDirectories={journal}\nledgerDirectories={ledgers},{tmp_path / 'l2'}\n"
    )
    with pytest.raises(SystemExit) as exited:
        main(["shell", "--conf", str(conf), "lastmark"])
    assert exited.value.code == 1
    assert "2 ledger directories" in capsys.readouterr().err
    main(["shell", "--conf", str(conf), "lastmark", "--ledger-dir", ledgers])
    assert "LastLogMark: journal file 0 (0)" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(
            [
                "shell",
                "--conf",
                str(conf),
                "rebuild-db-ledgers-index",
                "--ledger-dir",
                str(tmp_path),
            ]
        )
    assert "is none of the bookie's ledger directories" in capsys.readouterr().err
