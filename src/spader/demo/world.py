"""A small fictional world for the CPU demo: topics ("films directed by Ilse Varga"), their answer
entities, and ~100-word encyclopedia passages that mention them, so that a search for a question
finds its answers. Everything is generated from one seed; nothing is copied from a real source.

The world has two sides that share no name: the training side (``World.topics``, ``passages``)
and the evaluation side (``eval_topics``, ``eval_passages``), drawn after it from a stream of its
own, so the training side is the same whatever the evaluation side's size. The bundled demo asks
about the evaluation side only in the datasets' test splits.

The hand-written entities carry the spelling cases of norm_v1 (docs/data.md; diacritics, dotted and
stroked letters, a no-break space, articles, apostrophes, hyphens, ``&``, ``?``).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field

__all__ = [
    "EVAL_TOPICS",
    "Entity",
    "Topic",
    "World",
    "WorldPassage",
    "build_world",
    "name_parts",
    "topic_names",
]

SEED = 20210101
#: evaluation topics of the bundled demo (``build_world(n_eval=EVAL_TOPICS)``): each dataset's test
#: split asks 50 or more questions about them, and nothing else does
EVAL_TOPICS = 70

# kind: (subject noun, object noun, question, webqsp question, quest phrase, quest title suffix)
KINDS = {
    "film": (
        "film director",
        "film",
        "Which films were directed by {s}?",
        "what films did {s} direct",
        "Films directed by {s}",
        " ({year} film)",
    ),
    "novel": (
        "novelist",
        "novel",
        "Which novels were written by {s}?",
        "what books did {s} write",
        "Novels by {s}",
        " (novel)",
    ),
    "river": (
        "lake",
        "river",
        "Which rivers flow into {s}?",
        "what rivers flow into {s}",
        "Rivers of the {s} basin",
        "",
    ),
    "village": (
        "district",
        "village",
        "Which villages are in the {s} district?",
        "what villages are in {s} district",
        "Villages in the {s} district",
        "",
    ),
    "album": (
        "band",
        "album",
        "Which albums were released by {s}?",
        "what albums did {s} release",
        "Albums by {s}",
        " (album)",
    ),
    "player": (
        "football club",
        "footballer",
        "Which footballers have played for {s}?",
        "who played for {s}",
        "Footballers of {s}",
        " (footballer)",
    ),
    "plant": (
        "plant genus",
        "species",
        "Which plant species belong to the genus {s}?",
        "what species are in the genus {s}",
        "Plants in the genus {s}",
        "",
    ),
}

_FIRST = [
    "Marek",
    "Tove",
    "Anselm",
    "Ruta",
    "Casimir",
    "Edda",
    "Lennart",
    "Orla",
    "Piet",
    "Greta",
    "Ivo",
    "Sabine",
    "Teodor",
    "Wanda",
    "Jorun",
    "Milo",
    "Nadia",
    "Bram",
    "Liesel",
    "Oskar",
    "Vera",
    "Hanno",
    "Ines",
    "Karel",
    "Mira",
    "Stig",
    "Agata",
    "Rolf",
    "Elin",
    "Dorian",
    "Fenna",
    "Gustav",
]
_SYL = [
    "var",
    "hol",
    "bre",
    "mor",
    "dun",
    "kes",
    "tal",
    "ven",
    "ros",
    "lind",
    "ost",
    "sel",
    "gar",
    "nor",
    "pel",
    "vik",
    "dal",
    "mer",
    "sten",
    "ald",
    "bor",
    "fen",
    "tor",
    "wil",
    "ask",
    "ruk",
    "lem",
    "zan",
]
_END = ["a", "en", "ner", "ow", "sen", "ik", "ard", "is", "ov", "el", "ing", "ka"]
_ADJ = [
    "Silent",
    "Broken",
    "Golden",
    "Hollow",
    "Northern",
    "Quiet",
    "Crimson",
    "Distant",
    "Last",
    "Pale",
    "Iron",
    "Bitter",
    "Hidden",
    "Second",
    "Narrow",
    "Burning",
    "Frozen",
    "Wandering",
    "Lost",
    "Velvet",
]
_NOUN = [
    "Harbor",
    "Lantern",
    "Orchard",
    "Meadow",
    "Ferry",
    "Tower",
    "Winter",
    "Garden",
    "Bridge",
    "Signal",
    "Compass",
    "Archive",
    "Mirror",
    "Station",
    "Island",
    "Summer",
    "Harvest",
    "Letter",
    "Window",
    "Anchor",
]
_PLACE = [
    "Kesvik",
    "Doran Bay",
    "Altmere",
    "Sorrel Point",
    "Vantoft",
    "Hessel",
    "Brinmoor",
    "Calder Reach",
    "Ostrava Nova",
    "Tallwick",
    "Marrow Fen",
    "Eskholm",
]
_GENRE = ["drama", "comedy", "thriller", "war", "musical", "mystery"]
_NATION = ["Norland", "Vesterian", "Ostmark", "Calderan"]
_EPITHET = ["alpina", "minor", "borealis", "lucida", "montana", "palustris", "rubra", "gracilis", "nana"]

# (kind, subject, objects as (name, aliases)): the spelling cases of norm_v1 (docs/data.md).
_FIXED = [
    (
        "film",
        "Ilse Varga",
        [
            ("The Salt Orchard", ["Salt Orchard", "A sós gyümölcsös"]),
            ("Winter Quay", []),
            ("What Price Courage?", []),
            ("Saint-Malo Express", []),
        ],
    ),
    (
        "novel",
        "Edvard Lunn",
        [
            ("A Map of Small Rivers", ["Map of Small Rivers"]),
            ("Lamps of the North Coast", []),
            ("The Tin Lighthouse", []),
        ],
    ),
    (
        "village",
        "Górny Vale",
        [
            ("İznikköy", []),
            ("Ørnes", ["Ornes"]),
            ("Łowicz Górny", []),
            ("Port\u00a0Hollin", ["Port Hollin"]),
            ("Café Noël", []),
        ],
    ),
    ("album", "Halcyon & Rust", [("Viola d'amore", []), ("Jay-Z Sessions", []), ("Copper Tide", [])]),
    ("film", "Teodor Hask", [("Heat", []), ("The Ferry Lantern", []), ("Night at Kesvik", [])]),
    ("film", "Marta Velling", [("Heat", []), ("Quiet Archive", []), ("The Long Signal", [])]),
]


@dataclass
class Entity:
    name: str  # raw name, may hold a no-break space (a case of norm_v1, docs/data.md)
    aliases: list[str]
    kind: str
    year: int
    qid: str  # Wikidata-like id used by the Mintaka file
    mid: str  # Freebase-like id used by the WebQSP file

    @property
    def plain(self) -> str:
        """The name as passages print it (no-break space as a space)."""
        return self.name.replace("\u00a0", " ")


@dataclass
class Topic:
    kind: str
    subject: Entity
    objects: list[Entity]

    def question(self) -> str:
        return KINDS[self.kind][2].format(s=self.subject.plain)


@dataclass
class WorldPassage:
    page_id: int
    chunk: int
    title: str
    text: str

    @property
    def id(self) -> str:
        return f"{self.page_id}__{self.chunk}"


@dataclass
class World:
    """Two sides that share no name: ``topics`` and ``passages`` are what training, the warm start
    and the tiny tokenizer may see; ``eval_topics`` and ``eval_passages`` are the evaluation
    side, asked about only in the datasets' test splits (the corpus holds both sides)."""

    topics: list[Topic]
    passages: list[WorldPassage] = field(default_factory=list)
    eval_topics: list[Topic] = field(default_factory=list)
    eval_passages: list[WorldPassage] = field(default_factory=list)

    @property
    def corpus(self) -> list[WorldPassage]:
        """Every passage of both sides, as the bundled dump holds them."""
        return [*self.passages, *self.eval_passages]


class _Names:
    """Unique generated names (a name is never reused, so passages never mention a stray answer)."""

    def __init__(self, rng: random.Random, taken: list[str]):
        self.rng, self.taken = rng, {t.lower() for t in taken}

    def _unique(self, make) -> str:
        while True:
            name = make()
            if name.lower() not in self.taken:
                self.taken.add(name.lower())
                return name

    def word(self) -> str:
        r = self.rng
        return self._unique(lambda: (r.choice(_SYL) + r.choice(_SYL) + r.choice(_END)).capitalize())

    def person(self) -> str:
        r = self.rng
        return self._unique(lambda: f"{r.choice(_FIRST)} {(r.choice(_SYL) + r.choice(_END)).capitalize()}")

    def title(self) -> str:
        r = self.rng
        forms = [
            lambda: f"The {r.choice(_ADJ)} {r.choice(_NOUN)}",
            lambda: f"{r.choice(_ADJ)} {r.choice(_NOUN)}",
            lambda: f"{r.choice(_NOUN)} of {r.choice(_PLACE)}",
        ]
        return self._unique(lambda: r.choice(forms)())

    def subject(self, kind: str) -> str:
        if kind in ("film", "novel"):
            return self.person()
        word = self.word()
        return {
            "river": f"Lake {word}",
            "village": f"{word} Vale",
            "album": f"The {word}s",
            "player": f"{word} Rovers",
            "plant": f"{word}ia",
        }[kind]

    def object(self, kind: str, subject: str) -> str:
        if kind in ("film", "novel", "album"):
            return self.title()
        if kind == "player":
            return self.person()
        if kind == "plant":
            return self._unique(lambda: f"{subject} {self.rng.choice(_EPITHET)}")
        return self.word()


class _HeldNames(_Names):
    """Names of the evaluation side: besides every name taken, a name is refused when it differs
    from a taken one only by a leading "The" (the alias the world gives such a title)."""

    @staticmethod
    def _variants(name: str) -> set[str]:
        low = name.lower()
        return {low, f"the {low}", low.removeprefix("the ")}

    def _unique(self, make) -> str:
        while True:
            name = make()
            if not self._variants(name) & self.taken:
                self.taken |= self._variants(name)
                return name


def name_parts() -> list[str]:
    """The pieces generated names are made of (syllables, endings, first names, title words,
    places, epithets), each as it can start a name and as it continues one. The tiny demo model's
    tokenizer learns these rather than whole names, so a name it never saw in training is still
    written with tokens it did see."""
    pieces = [*_SYL, *_END, *_FIRST, *_ADJ, *_NOUN, *_PLACE, *_EPITHET, *_NATION, *_GENRE]
    pieces += ["The", "of", "Lake", "Vale", "Rovers", "ia", "s"]  # the words around generated ones
    pieces += [p.capitalize() for p in _SYL]
    pieces += [a + b for a in _SYL for b in _END]  # a word's last syllable with its ending
    return list(dict.fromkeys(pieces))


# Key sentence (states the relation, so a search for the question finds it) and filler sentences.
_KEY = {
    "film": "{o} is a {year} {genre} film directed by {s}.",
    "novel": "{o} is a {year} novel written by {s}, the {nation} novelist.",
    "river": "The {o} is a river of {place} that flows into {s}.",
    "village": "{o} is a village in the {s} district, in the hills north of {place}.",
    "album": "{o} is a {year} studio album released by the band {s}.",
    "player": "{o} is a {nation} footballer who played as a midfielder for {s} from {year}.",
    "plant": "{o} is a flowering plant species in the genus {s}, first described in {year}.",
}
_FILLER = [
    "It was largely made in {place}, where the local press followed its progress closely.",
    "A restored edition appeared in {year2} and was welcomed by a new generation of readers and viewers.",
    "Critics noted its patient pacing and the careful attention it pays to ordinary working life.",
    "The work was discussed at length during the {place} autumn festival of {year2}.",
    "Several scenes are set along the coast between {place} and {place2}, an area known for its ferries.",
    "Local historians in {place} later collected letters and photographs related to it.",
    "It received a regional award in {year2}, the first of several such honours.",
    "The name is often misspelled in older catalogues of the {nation} national library.",
    "Its early reception was mixed, but opinion changed after a long essay appeared in {year2}.",
    "Today it is listed in most surveys of {nation} culture of the period.",
]
_SUBJECT = {
    "film": "{s} is a {nation} film director born in {place} in {year}. {s} directed {list}.",
    "novel": "{s} is a {nation} novelist born in {place} in {year}. {s} wrote {list}.",
    "river": "{s} is a lake in {place}. The rivers that flow into {s} are {list}.",
    "village": "The {s} district lies north of {place}. The villages of the {s} district are {list}.",
    "album": "{s} is a {nation} rock band formed in {place} in {year}. Albums released by {s}: {list}.",
    "player": "{s} is a football club from {place}, founded in {year}. "
    "Footballers who played for {s} include {list}.",
    "plant": "{s} is a genus of flowering plants described in {year}. Species in the genus {s}: {list}.",
}
_DISTRACT = [
    "The {place} lighthouse was built in {year} to guard the narrow channel between the islands.",
    "A ferry service between {place} and {place2} operated every summer until {year2}.",
    "The {place} market hall hosts a fair each spring that draws traders from the whole region.",
    "Records from {year} describe a severe winter in {place} that froze the harbour for weeks.",
    "The old railway line to {place2} was closed in {year2} and is now a cycling path.",
    "In {year} the town council of {place} opened a public library in the former customs house.",
]


def _fill(rng: random.Random, template: str, **known: object) -> str:
    p1, p2 = rng.sample(_PLACE, 2)
    values = {
        "place": p1,
        "place2": p2,
        "year2": rng.randint(1965, 2019),
        "nation": rng.choice(_NATION),
        "genre": rng.choice(_GENRE),
        **known,
    }
    return template.format(**values)


def _passage_text(rng: random.Random, first: str, pool: list[str], words: int = 95) -> str:
    sentences = [first]
    for template in rng.sample(pool, len(pool)):
        if len(" ".join(sentences).split()) >= words:
            break
        sentences.append(_fill(rng, template, year=rng.randint(1900, 1990)))
    return " ".join(sentences)


def _listing(names: list[str]) -> str:
    return ", ".join(names[:-1]) + " and " + names[-1] if len(names) > 1 else names[0]


def topic_names(topics: list[Topic]) -> list[str]:
    """Every name ``topics`` use: each subject's and object's name and each alias."""
    return [n for t in topics for e in (t.subject, *t.objects) for n in (e.name, *e.aliases)]


def _generated_topics(names: _Names, entity, kinds: list[str], n: int, rng: random.Random) -> list[Topic]:
    """``n`` generated topics, kinds in turn, 3-7 objects each."""
    topics = []
    for i in range(n):
        kind = kinds[i % len(kinds)]
        subject = names.subject(kind)
        objects = [entity(names.object(kind, subject), [], kind) for _ in range(rng.randint(3, 7))]
        for o in objects:  # an alias without the leading article, as Wikipedia redirects have
            if o.name.startswith("The "):
                o.aliases.append(o.name[4:])
        topics.append(Topic(kind, entity(subject, [], kind), objects))
    return topics


def _topic_passages(rng: random.Random, topics: list[Topic], page: Iterator[int]) -> list[WorldPassage]:
    """One passage per answer entity and two per topic subject."""
    out = []
    for t in topics:
        s = t.subject.plain
        for o in t.objects:
            key = _fill(rng, _KEY[t.kind], o=o.plain, s=s, year=o.year)
            out.append(WorldPassage(next(page), 0, o.plain, _passage_text(rng, key, _FILLER)))
        pid = next(page)
        intro = _fill(
            rng, _SUBJECT[t.kind], s=s, year=t.subject.year, list=_listing([o.plain for o in t.objects])
        )
        out.append(WorldPassage(pid, 0, s, _passage_text(rng, intro, _FILLER)))
        more = _fill(rng, "In {year2}, {s} was the subject of an exhibition in {place}.", s=s)
        out.append(WorldPassage(pid, 1, s, _passage_text(rng, more, _FILLER)))
    return out


def build_world(seed: int = SEED, n_generated: int = 34, n_distractors: int = 80, n_eval: int = 0) -> World:
    """The demo world: 6 hand-written topics plus ``n_generated`` generated ones, their passages
    (one per answer entity, two per topic subject) and ``n_distractors`` unrelated passages; then
    ``n_eval`` generated evaluation topics and their passages, drawn from a stream of their own
    with names the first side never uses (so that side is the same whatever ``n_eval`` is)."""
    rng = random.Random(seed)
    fixed_names = [s for _, s, _ in _FIXED] + [o for _, _, objs in _FIXED for o, _ in objs]
    names = _Names(rng, fixed_names + _PLACE)
    counter = iter(range(1, 10_000))

    def entity_from(r: random.Random):
        def entity(name: str, aliases: list[str], kind: str) -> Entity:
            n = next(counter)
            return Entity(name, aliases, kind, r.randint(1925, 1995), f"Q{7000 + n}", f"m.0{n:04x}d")

        return entity

    entity = entity_from(rng)
    topics = []
    for kind, subject, objects in _FIXED:
        topics.append(Topic(kind, entity(subject, [], kind), [entity(o, a, kind) for o, a in objects]))
    kinds = list(KINDS)
    topics += _generated_topics(names, entity, kinds, n_generated, rng)

    world = World(topics)
    page = iter(range(10_000, 1_000_000, 37))
    world.passages += _topic_passages(rng, topics, page)
    for _ in range(n_distractors):
        first = _fill(rng, rng.choice(_DISTRACT), year=rng.randint(1850, 1990))
        world.passages.append(
            WorldPassage(next(page), 0, rng.choice(_PLACE), _passage_text(rng, first, _DISTRACT + _FILLER))
        )
    if n_eval:
        held = random.Random(f"{seed}:evaluation")
        held_names = _HeldNames(held, [])
        held_names.taken = set(names.taken)  # no evaluation name is a name or alias of the first side
        for name in topic_names(topics):
            held_names.taken |= _HeldNames._variants(name)
        world.eval_topics = _generated_topics(held_names, entity_from(held), kinds, n_eval, held)
        world.eval_passages = _topic_passages(held, world.eval_topics, page)
    return world
