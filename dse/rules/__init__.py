"""What a point is and which points can run: the space and system files read into pydantic models (``space``),
one resolved point (``trial``: catalogue defaults < recipe layout < settings < point), the validity rules
(``constraints``) and the valid points of a space counted (``counting``). The rules read the facts below them;
the model, the evaluation of a point and the study read the rules.
"""
