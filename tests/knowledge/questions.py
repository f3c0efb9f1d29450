"""A generated question set for retrieval: documents about made-up people, companies, places
and product codes (names no embedding model has seen), and questions about each document in
other words that name one of its made-up names. Deterministic for a seed; used by the tests
and by ``bench/search.py`` (recall@5 of vector against hybrid search)."""

from __future__ import annotations

import random
from dataclasses import dataclass

_ONSETS = ("b", "br", "c", "d", "dr", "f", "g", "gl", "h", "j", "k", "kr", "l", "m", "n",
           "p", "pr", "qu", "r", "s", "st", "t", "tr", "v", "w", "z")
_VOWELS = ("a", "e", "i", "o", "u", "ae", "ei", "ou")
_CODAS = ("", "n", "r", "s", "th", "x", "l", "nd", "sk", "m")

# Per topic: what the document says (a team, what it looks after, a routine) and how a
# question asks about it without those words.
TOPICS = (
    ("cold storage", "maintains the refrigeration units and the freezer rooms",
     "audits the cooling energy every quarter", "keeps things chilled"),
    ("payroll", "runs the monthly salary payments and the pension deductions",
     "reconciles the ledger with the bank every Friday", "pays the staff"),
    ("fleet", "schedules the delivery vans and their drivers",
     "services every truck after 20,000 kilometres", "looks after the vehicles"),
    ("network", "operates the routers, firewalls and the office wifi",
     "patches the switches on the first Monday of the month", "keeps the internet running"),
    ("recruiting", "interviews applicants and writes the job adverts",
     "reviews the hiring pipeline with managers weekly", "finds new employees"),
    ("legal", "drafts supplier contracts and checks the privacy notices",
     "files the trademark renewals each spring", "handles agreements and lawyers"),
    ("brewing", "brews the seasonal lagers and tests the hops",
     "cleans the fermentation tanks after each batch", "makes the beer"),
    ("security", "manages the door badges and the camera system",
     "runs a fire drill twice a year", "protects the building"),
)


@dataclass(frozen=True)
class Document:
    item_id: str
    title: str
    text: str
    person: str
    company: str
    city: str
    code: str


@dataclass(frozen=True)
class Question:
    text: str
    item_id: str  # the document that answers it


def _name(rng: random.Random, syllables: int) -> str:
    word = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) for _ in range(syllables))
    return (word + rng.choice(_CODAS)).capitalize()


def documents(count: int, seed: int = 27) -> list[Document]:
    """``count`` documents, each about a different made-up person, company, place and
    product code, on one of the topics (so many documents share a topic's words)."""
    rng = random.Random(seed)
    found: list[Document] = []
    seen: set[str] = set()
    while len(found) < count:
        person = f"{_name(rng, 2)} {_name(rng, 2)}"
        company = f"{_name(rng, 3)} {rng.choice(('Foods', 'Logistics', 'Systems', 'Works'))}"
        city = f"{_name(rng, 2)} {rng.choice(('Vale', 'Harbour', 'Heights', 'Ford'))}"
        code = f"{rng.choice('BCDFGHJKLMNPQRSTVWXZ')}{rng.choice('ABCDEFGHKLMNPRSTVX')}-" \
               f"{rng.randrange(1000, 10000)}"
        if {person, company, city, code} & seen:
            continue
        seen |= {person, company, city, code}
        team, duty, routine, _ = TOPICS[len(found) % len(TOPICS)]
        text = (f"{person} leads the {team} team at {company} in {city}. The team {duty}, "
                f"and it {routine}. Equipment and requests are tracked under the reference "
                f"{code}; {person.split()[0]} signs off every change to it.")
        found.append(Document(f"doc-{len(found)}", f"{team.title()} at {company}", text,
                              person, company, city, code))
    return found


def questions(docs: list[Document]) -> list[Question]:
    """Three questions per document, each naming one of its made-up names and asking about
    it in words the document does not use."""
    asked: list[Question] = []
    for index, doc in enumerate(docs):
        _, _, _, gist = TOPICS[index % len(TOPICS)]
        asked += [
            Question(f"Who at {doc.company} {gist}?", doc.item_id),
            Question(f"What is {doc.person}'s job?", doc.item_id),
            Question(f"Which group is responsible for {doc.code}?", doc.item_id),
        ]
    return asked
