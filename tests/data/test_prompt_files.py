import json
import sys

import pytest

from hybridflow.data import load_prompt_dataset
from hybridflow.errors import UserError


def _jsonl(path, rows):
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    return str(path)


def test_jsonl_with_custom_prompt_field(tmp_path):
    src = _jsonl(
        tmp_path / "d.jsonl", [{"question": "1+1=", "answer": "2"}, {"question": "2+2=", "answer": "4"}]
    )
    ds = load_prompt_dataset(src, prompt_key="question")
    assert len(ds) == 2 and ds.prompt(1) == "2+2=" and ds.rows[1]["answer"] == "4"


def test_missing_prompt_field_is_one_line_error_naming_it(tmp_path):
    src = _jsonl(tmp_path / "d.jsonl", [{"question": "q"}])
    with pytest.raises(UserError) as err:
        load_prompt_dataset(src, prompt_key="prompt")
    msg = str(err.value)
    assert msg.startswith("data.prompt_key:") and "'prompt'" in msg and "question" in msg and "\n" not in msg


@pytest.mark.parametrize(
    ("content", "match"),
    [("{bad json\n", "d.jsonl:1 is not valid JSON"), ("[1, 2]\n", "not a JSON object"), ("\n", "no rows")],
)
def test_malformed_files(tmp_path, content, match):
    (tmp_path / "d.jsonl").write_text(content)
    with pytest.raises(UserError, match=match):
        load_prompt_dataset(str(tmp_path / "d.jsonl"))


def test_non_text_prompt(tmp_path):
    with pytest.raises(UserError, match="not text"):
        load_prompt_dataset(_jsonl(tmp_path / "d.jsonl", [{"prompt": 3}]))


def test_rows_are_counted_from_1_like_the_file_lines(tmp_path):
    path = _jsonl(tmp_path / "d.jsonl", [{"prompt": "1+1="}, {"question": "2+2="}])
    with pytest.raises(UserError, match=r"row 2 of .*d\.jsonl has no field 'prompt'"):
        load_prompt_dataset(path)
    with pytest.raises(UserError, match=r"field 'prompt' of row 1 of"):
        load_prompt_dataset(_jsonl(tmp_path / "e.jsonl", [{"prompt": 3}]))


def test_missing_file_and_unknown_format(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load_prompt_dataset(str(tmp_path / "missing.jsonl"))
    with pytest.raises(UserError, match=r"\.jsonl/\.parquet"):
        load_prompt_dataset(str(tmp_path / "data.csv"))


def test_parquet_without_pyarrow_names_the_install(tmp_path, monkeypatch):
    (tmp_path / "d.parquet").write_bytes(b"PAR1")
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # import fails whether or not it is installed
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(UserError, match="pip install pyarrow"):
        load_prompt_dataset(str(tmp_path / "d.parquet"))


def test_parquet_round_trip(tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"text": ["a", "b"], "answer": ["1", "2"]}), tmp_path / "d.parquet")
    ds = load_prompt_dataset(str(tmp_path / "d.parquet"), prompt_key="text")
    assert [ds.prompt(i) for i in range(2)] == ["a", "b"]


def test_messages_name_the_field_given(tmp_path):
    (tmp_path / "d.jsonl").write_text("{bad json\n")
    for path, match in [(tmp_path / "d.jsonl", "is not valid JSON"), (tmp_path / "missing.jsonl", "does not exist"),
                        (tmp_path / "d.csv", "neither builtin")]:
        with pytest.raises(UserError, match=rf"^data\.val_source: .*{match}"):
            load_prompt_dataset(str(path), field="data.val_source")
    (tmp_path / "e.jsonl").write_text("\n")
    with pytest.raises(UserError, match=r"^data\.val_source: .*no rows; point data\.val_source at"):
        load_prompt_dataset(str(tmp_path / "e.jsonl"), field="data.val_source")


def test_a_jsonl_that_is_not_utf8_names_the_field_file_and_line(tmp_path):
    (tmp_path / "d.jsonl").write_bytes(b'{"prompt": "ok"}\n{"prompt": "caf\xe9"}\n')
    with pytest.raises(UserError, match=r"^data\.source: .*d\.jsonl:2 is not UTF-8 text .*; save the file as "
                                        r"UTF-8") as err:
        load_prompt_dataset(str(tmp_path / "d.jsonl"))
    assert "\n" not in str(err.value)


def test_a_corrupt_parquet_names_the_field_and_file(tmp_path):
    pytest.importorskip("pyarrow")
    (tmp_path / "d.parquet").write_bytes(b"this is not parquet")
    with pytest.raises(UserError, match=r"^data\.val_source: .*d\.parquet is not a readable Parquet file .*; "
                                        r"point data\.val_source at a Parquet file") as err:
        load_prompt_dataset(str(tmp_path / "d.parquet"), field="data.val_source")
    assert "\n" not in str(err.value)
