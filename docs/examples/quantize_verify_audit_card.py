"""Quantize, verify against the source, audit and write the card: the pipeline from Python.

Runs as is (``python quantize_verify_audit_card.py``, on the built-in tiny model) and type-checks
under ``mypy --strict`` (tests/test_api_is_the_cli.py runs it; tests/test_wheel.py type-checks it
in the environment `make setup` makes and in a wheel install)."""
import ggufmtp

source = "builtin:tiny-qwen35moe"  # or your BF16 GGUF: ggufmtp.pull("owner/Model-BF16-GGUF").model_path
made = ggufmtp.quantize(source, "hifi-q4_k_m-mtp", "tiny-mtp.gguf", progress=False)  # + its receipt
assert made.receipt is not None, "written beside the artifact before the artifact was published"
print(made.summary())

options = ggufmtp.VerifyOptions(reference=source, seeds=(42,), limit=2, max_tokens=16)
check = ggufmtp.verify(made.output, options, receipt=made.receipt, progress=False)  # into the receipt
print(f"verdict {check.verdict}: acceptance {check.main.acceptance:.1%}")

report = ggufmtp.audit(made.output, made.receipt, progress=False)
assert report.ok, [c.detail for c in report.checks if not c.ok]
print("card:", ggufmtp.make_card(made.output, made.receipt))
