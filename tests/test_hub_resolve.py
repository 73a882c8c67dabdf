"""#50 item 3: the pinned llama.cpp's ``-hf`` resolver, simulated (ggufmtp/quant/hf_resolve.py), rule by
rule on designed listings. ``test_hf_resolve_runtime.py`` checks the simulation against the real
pinned llama-server on the local Hub."""

from __future__ import annotations

from ggufmtp.quant.hf_resolve import find_draft, find_model, order_problems, quant_bits, resolve, split_files, split_info


def test_split_info_and_quant_bits_read_the_name_as_download_cpp_does():
    s = split_info("a/M-Q4_K_M-00002-of-00003.gguf")
    assert (s.prefix, s.tag, s.index, s.count) == ("a/M-Q4_K_M", "Q4_K_M", 2, 3)
    assert split_info("M-q8_0.gguf").tag == "Q8_0" and split_info("M.GGUF").count == 0  # .gguf is case-sensitive
    assert [quant_bits(n) for n in ("mtp-M-Q8_0.gguf", "M-F16.gguf", "M-IQ4_XS.gguf", "M.gguf")] == [8, 16, 4, 0]


def test_the_model_is_the_first_model_file_matching_tag_dot_or_dash():
    listing = ["mtp-M-Q8_0.gguf", "M-imatrix-Q8_0.gguf", "M-Q8_0-00002-of-00002.gguf", "M-Q8_0-00001-of-00002.gguf",
               "M-q4_k_m.gguf", "MTP-M-Q6_K.gguf"]
    assert find_model(listing, "q8_0") == "M-Q8_0-00001-of-00002.gguf"  # sidecar, imatrix, later shard skipped
    assert find_model(listing, "Q4_K_M") == "M-q4_k_m.gguf"  # case-insensitive
    assert find_model(listing, "Q6_K") == "MTP-M-Q6_K.gguf"  # "mtp-" is searched case-sensitively
    assert find_model(listing, "Q4_K") is None  # "Q4_K_" is not "Q4_K" followed by '.' or '-'
    assert find_model(listing, None) == "M-q4_k_m.gguf"  # no tag: Q4_K_M first, wherever it is listed
    assert find_model(["b/M-Q8_0.gguf", "a/M-Q4_K_M.gguf"], None) == "a/M-Q4_K_M.gguf"  # Q4_K_M before Q8_0
    assert find_model(["M-Q6_K.gguf", "N-Q6_K.gguf"], None) == "M-Q6_K.gguf"  # then the first model
    assert find_model(["Q8_0-dir/M.gguf"], "Q8_0") == "Q8_0-dir/M.gguf"  # the path is searched, folders too
    assert split_files(listing, "M-Q8_0-00001-of-00002.gguf") == ("M-Q8_0-00002-of-00002.gguf",
                                                                  "M-Q8_0-00001-of-00002.gguf")


def test_the_draft_is_the_best_mtp_file_in_the_models_folder_or_above():
    listing = ["mtp-M-Q4_0.gguf", "full/M-Q8_0.gguf", "full/sub/mtp-M-Q8_0.gguf", "pair/M-Q4_K_M.gguf",
               "pair/mtp-M-Q8_0.gguf", "pair/mtp-M-Q4_K_M.gguf", "pair/mtp-M-F16.gguf"]
    # an embedded-head variant beside (above) a sidecar gets it as its draft; a folder below is never reached
    assert find_draft(listing, "full/M-Q8_0.gguf", "Q8_0") == "mtp-M-Q4_0.gguf"
    assert find_draft(listing, "pair/M-Q4_K_M.gguf", "Q4_K_M") == "pair/mtp-M-Q4_K_M.gguf"  # exact -TAG.
    assert find_draft(listing, "pair/M-Q4_K_M.gguf", "Q6_K") == "pair/mtp-M-Q8_0.gguf"  # |8-6| < |16-6|, |4-6|: first
    assert find_draft(listing, "pair/M-Q4_K_M.gguf", "IQ4_XS") == "pair/mtp-M-Q4_K_M.gguf"  # 4 bits
    assert find_draft(listing, "pair/M-Q4_K_M.gguf", None) == "pair/mtp-M-Q4_K_M.gguf"  # the model's own bits
    assert find_draft(["mtp-a/M-Q8_0.gguf"], "M-Q8_0.gguf", "Q8_0") is None  # a folder below the model's
    assert find_draft(["x/mtp-M-Q8_0.gguf"], None, "Q8_0") is None  # no model: the repo's root only


def test_resolve_gives_the_files_downloaded_and_a_preset_takes_over():
    listing = ["M-Q8_0-00001-of-00002.gguf", "M-Q8_0-00002-of-00002.gguf", "mtp-M-Q8_0.gguf", "README.md"]
    r = resolve(listing, "Q8_0")
    assert r.model == "M-Q8_0-00001-of-00002.gguf" and r.draft == "mtp-M-Q8_0.gguf"
    assert r.files == ("M-Q8_0-00001-of-00002.gguf", "M-Q8_0-00002-of-00002.gguf", "mtp-M-Q8_0.gguf")
    assert resolve(listing, "Q8_0", draft_mtp=False).draft is None  # no --spec-type draft-mtp: no sidecar
    assert resolve([*listing, "preset.ini"], "Q8_0").preset


def test_order_problems_name_every_tag_whose_outcome_the_listing_order_decides():
    assert order_problems(["M-Q8_0.gguf", "x/M-Q8_0.gguf"], ["Q8_0"])  # two files for one tag
    assert order_problems(["M-Q4_K_M.gguf", "mtp-M-Q8_0.gguf", "mtp-N-Q8_0.gguf"], ["Q4_K_M"])  # tied sidecars
    assert not order_problems(["M-Q4_K_M.gguf", "M-Q8_0.gguf", "mtp-M-Q8_0.gguf", "sub/mtp-M-Q8_0.gguf"],
                              ["Q4_K_M", "Q8_0"])
